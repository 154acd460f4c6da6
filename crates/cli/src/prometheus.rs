//! `gleaner status --prometheus`: the far-memory stats of the programs running on this machine
//! in the Prometheus text format, one sample per process labelled with its `pid` and
//! `program`. Written to a file in node-exporter's textfile directory (atomically: write a
//! temporary file, then rename), they join the host's other metrics.
//!
//! Only documents of processes running on far memory (with `stats`) are rendered; other kinds
//! in the status directory are skipped.

use gleaner_metrics::{Exposition, MetricType::Counter, MetricType::Gauge};
use serde_json::Value;

/// One metric read from a process's document.
struct Metric {
    name: &'static str,
    kind: gleaner_metrics::MetricType,
    help: &'static str,
    /// Extra label and its value, if the family splits by one.
    label: Option<(&'static str, &'static str)>,
    /// The value from the document.
    read: fn(&Value) -> f64,
}

/// A number at `path` (keys from the document's `stats`), 0 where absent.
fn at(doc: &Value, path: &[&str]) -> f64 {
    let mut v = &doc["stats"];
    for k in path {
        v = &v[*k];
    }
    v.as_f64().unwrap_or(0.0)
}

const PAGE: f64 = gleaner_proto::PAGE_SIZE as f64;

/// The metrics, in output order; entries of one family sit together.
const METRICS: &[Metric] = &[
    Metric {
        name: "gleaner_program_budget_bytes",
        kind: Gauge,
        help: "A process's local memory budget.",
        label: None,
        read: |d| at(d, &["budget_pages"]) * PAGE,
    },
    Metric {
        name: "gleaner_program_resident_bytes",
        kind: Gauge,
        help: "Managed memory resident in the process now.",
        label: None,
        read: |d| at(d, &["resident_pages"]) * PAGE,
    },
    Metric {
        name: "gleaner_program_far_bytes",
        kind: Gauge,
        help: "Pages of the process held on its memnode(s), at 4 KiB each (uncompressed).",
        label: None,
        read: |d| at(d, &["remote_pages"]) * PAGE,
    },
    Metric {
        name: "gleaner_program_far_stored_bytes",
        kind: Gauge,
        help: "What the process's far pages take on its memnode(s) (compressed blobs).",
        label: None,
        read: |d| at(d, &["store", "blob_bytes"]),
    },
    Metric {
        name: "gleaner_program_faults_total",
        kind: Counter,
        help: "Page faults served by the pager, by kind.",
        label: Some(("kind", "remote")),
        read: |d| at(d, &["faults", "remote"]),
    },
    Metric {
        name: "gleaner_program_faults_total",
        kind: Counter,
        help: "",
        label: Some(("kind", "zero_fill")),
        read: |d| at(d, &["faults", "zero_fill"]),
    },
    Metric {
        name: "gleaner_program_faults_total",
        kind: Counter,
        help: "",
        label: Some(("kind", "write_protect")),
        read: |d| at(d, &["faults", "write_protect"]),
    },
    Metric {
        name: "gleaner_program_evictions_total",
        kind: Counter,
        help: "Pages evicted to far memory, by kind.",
        label: Some(("kind", "clean")),
        read: |d| at(d, &["evictions", "clean"]),
    },
    Metric {
        name: "gleaner_program_evictions_total",
        kind: Counter,
        help: "",
        label: Some(("kind", "dirty")),
        read: |d| at(d, &["evictions", "dirty"]),
    },
    Metric {
        name: "gleaner_program_received_bytes_total",
        kind: Counter,
        help: "Bytes of pages brought in from far memory.",
        label: None,
        read: |d| at(d, &["bytes_in"]),
    },
    Metric {
        name: "gleaner_program_sent_bytes_total",
        kind: Counter,
        help: "Bytes of pages sent out to far memory.",
        label: None,
        read: |d| at(d, &["bytes_out"]),
    },
    Metric {
        name: "gleaner_program_memnode_reconnects_total",
        kind: Counter,
        help: "Broken memnode connections the process replaced.",
        label: None,
        read: |d| at(d, &["store", "reconnects"]),
    },
    Metric {
        name: "gleaner_program_direct_reclaim_waits_total",
        kind: Counter,
        help: "Faults that waited for direct reclaim.",
        label: None,
        read: |d| at(d, &["reclaim", "direct_waits"]),
    },
    Metric {
        name: "gleaner_program_remote_fault_latency_seconds",
        kind: Gauge,
        help: "Remote fault latency percentiles since the process started.",
        label: Some(("quantile", "0.5")),
        read: |d| at(d, &["remote_fault_latency", "p50_us"]) / 1e6,
    },
    Metric {
        name: "gleaner_program_remote_fault_latency_seconds",
        kind: Gauge,
        help: "",
        label: Some(("quantile", "0.99")),
        read: |d| at(d, &["remote_fault_latency", "p99_us"]) / 1e6,
    },
];

/// The exposition of every far-memory process in `docs` (status documents).
pub fn render(docs: &[Value]) -> String {
    let procs: Vec<&Value> = docs.iter().filter(|d| d["stats"].is_object()).collect();
    let mut e = Exposition::new();
    e.single(
        "gleaner_programs",
        Gauge,
        "Processes running on far memory on this machine (fresh status files).",
        procs.len() as f64,
    );
    let mut last = "";
    for m in METRICS {
        if m.name != last {
            e.family(m.name, m.kind, m.help);
            last = m.name;
        }
        for d in &procs {
            let pid = d["pid"].as_u64().unwrap_or(0).to_string();
            let program = d["program"].as_str().unwrap_or("?");
            let mut labels = vec![("pid", pid.as_str()), ("program", program)];
            if let Some(l) = m.label {
                labels.push(l);
            }
            e.sample(&labels, (m.read)(d));
        }
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn processes_become_labelled_samples_and_other_documents_are_skipped() {
        let docs = [
            json!({"pid": 7, "program": "redis\"x", "stats": {"budget_pages": 2,
                "resident_pages": 1, "remote_pages": 3, "faults": {"remote": 5},
                "remote_fault_latency": {"p50_us": 6.5}, "store": {"reconnects": 2}}}),
            json!({"pid": 8, "kind": "latency_critical"}),
        ];
        let t = render(&docs);
        assert!(t.contains("gleaner_programs 1\n"), "{t}");
        assert!(
            t.contains("gleaner_program_budget_bytes{pid=\"7\",program=\"redis\\\"x\"} 8192\n"),
            "{t}"
        );
        assert!(
            t.contains("gleaner_program_faults_total{pid=\"7\",program=\"redis\\\"x\",kind=\"remote\"} 5\n"),
            "{t}"
        );
        assert!(t.contains("quantile=\"0.5\"} 0.0000065\n"), "{t}");
        assert_eq!(
            t.matches("# TYPE gleaner_program_faults_total").count(),
            1,
            "{t}"
        );
        assert!(!t.contains("pid=\"8\""), "{t}");
    }
}
