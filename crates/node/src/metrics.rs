//! The node daemon's state as Prometheus metrics (`gleaner node --metrics ADDR`), rendered from
//! the same document `gleaner node status` prints ([`crate::daemon::Daemon::status`]), on the
//! metrics thread: a scrape takes the daemon's state lock as long as `gleaner node status`
//! does, and the pools' counters are read from their shared control areas.

use gleaner_metrics::{Exposition, MetricType::Counter, MetricType::Gauge};
use serde_json::Value;

/// The metrics document for a status document `s`.
pub fn render(s: &Value) -> String {
    let n = |v: &Value| v.as_f64().unwrap_or(0.0);
    let mut e = Exposition::new();
    e.single(
        "gleaner_node_memory_total_bytes",
        Gauge,
        "Memory of the machine (or of the coordinated cgroup).",
        n(&s["total"]),
    );
    e.single(
        "gleaner_node_memory_available_bytes",
        Gauge,
        "Memory available now, as the daemon last read it.",
        n(&s["available"]),
    );
    e.single(
        "gleaner_node_soft_budget_bytes",
        Gauge,
        "What all soft pools may hold together now.",
        n(&s["budget"]),
    );
    let level = match s["level"].as_str() {
        Some("Moderate") => 1.0,
        Some("Severe") => 2.0,
        _ => 0.0,
    };
    e.single(
        "gleaner_node_pressure_level",
        Gauge,
        "Memory pressure as the daemon sees it: 0 none, 1 moderate (shrink cooperatively), 2 \
         severe (punch at once).",
        level,
    );
    e.single(
        "gleaner_node_psi_some_avg10_ratio",
        Gauge,
        "Pressure stall information, some tasks stalled (avg10), as a ratio.",
        n(&s["psi_some_avg10"]) / 100.0,
    );
    e.single(
        "gleaner_node_psi_full_avg10_ratio",
        Gauge,
        "Pressure stall information, all tasks stalled (avg10), as a ratio.",
        n(&s["psi_full_avg10"]) / 100.0,
    );
    e.single(
        "gleaner_node_direct_punched_bytes_total",
        Counter,
        "Bytes the daemon punched out of pools itself (their runtime too slow, or pressure severe).",
        n(&s["direct_punched_bytes"]),
    );
    e.single(
        "gleaner_node_direct_punch_seconds_total",
        Counter,
        "Time spent punching pools directly.",
        n(&s["direct_punch_secs"]),
    );
    e.family(
        "gleaner_node_errors_total",
        Counter,
        "Errors by kind: clients refused (a bad registration or message).",
    );
    e.sample(&[("kind", "refused_client")], n(&s["refused_clients"]));
    let pools: &[Value] = s["pools"].as_array().map_or(&[], |v| v.as_slice());
    e.single(
        "gleaner_node_pools",
        Gauge,
        "Soft-memory pools registered now.",
        pools.len() as f64,
    );
    type Read = fn(&Value) -> f64;
    let per_pool: [(&str, _, &str, Read); 8] = [
        (
            "gleaner_node_pool_limit_bytes",
            Gauge,
            "A pool's grant: the most it may hold.",
            |p| p["limit"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_resident_bytes",
            Gauge,
            "Memory a pool's memfd holds now.",
            |p| p["resident"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_hits_total",
            Counter,
            "Reads of a pool that found their object.",
            |p| p["hits"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_misses_total",
            Counter,
            "Reads of a pool that ran the reconstructor.",
            |p| p["misses"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_rebuild_seconds_total",
            Counter,
            "Time a pool's reconstructors ran.",
            |p| p["rebuild_ns"].as_f64().unwrap_or(0.0) / 1e9,
        ),
        (
            "gleaner_node_pool_rebuilt_bytes_total",
            Counter,
            "Bytes a pool's reconstructors rebuilt.",
            |p| p["miss_bytes"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_punched_segments_total",
            Counter,
            "Segments the daemon punched out of a pool.",
            |p| p["punched_segments"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_pool_released_segments_total",
            Counter,
            "Segments a pool's runtime released itself.",
            |p| p["released_segments"].as_f64().unwrap_or(0.0),
        ),
    ];
    for (name, kind, help, read) in per_pool {
        e.family(name, kind, help);
        for p in pools {
            let id = p["id"].as_u64().unwrap_or(0).to_string();
            let pool = p["name"].as_str().unwrap_or("?");
            e.sample(&[("pool", &id), ("name", pool)], read(p));
        }
    }
    let programs: &[Value] = s["programs"].as_array().map_or(&[], |v| v.as_slice());
    e.single(
        "gleaner_node_elastic_total_bytes",
        Gauge,
        "What soft pools and far programs with elastic budgets may be granted together now.",
        n(&s["elastic_total"]),
    );
    let per_program: [(&str, _, &str, Read); 5] = [
        (
            "gleaner_node_program_limit_bytes",
            Gauge,
            "A far program's grant (its elastic budget's target).",
            |p| p["limit"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_program_budget_bytes",
            Gauge,
            "The budget a far program's pager applies now (above the grant while it shrinks).",
            |p| p["budget_applied"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_program_resident_bytes",
            Gauge,
            "What a far program's pager holds resident now.",
            |p| p["resident"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_program_far_faults_total",
            Counter,
            "Far faults a program's pager served.",
            |p| p["far_faults"].as_f64().unwrap_or(0.0),
        ),
        (
            "gleaner_node_program_loss_ratio",
            Gauge,
            "Time a far program lost to far memory over the last round, per second.",
            |p| p["loss_ns_per_s"].as_f64().unwrap_or(0.0) / 1e9,
        ),
    ];
    for (name, kind, help, read) in per_program {
        e.family(name, kind, help);
        for p in programs {
            let id = p["id"].as_u64().unwrap_or(0).to_string();
            let prog = p["name"].as_str().unwrap_or("?");
            e.sample(&[("program", &id), ("name", prog)], read(p));
        }
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_becomes_metrics() {
        let s = json!({"total": 1000, "available": 500, "budget": 300, "level": "Severe",
            "psi_some_avg10": 12.5, "refused_clients": 2, "direct_punch_secs": 0.25,
            "pools": [{"id": 3, "name": "cache", "limit": 64, "resident": 32,
                       "rebuild_ns": 1500000000u64}],
            "elastic_total": 4096,
            "programs": [{"id": 5, "name": "redis (pid 9)", "limit": 256, "budget_applied": 320,
                          "loss_ns_per_s": 2.5e8}]});
        let t = render(&s);
        assert!(t.contains("gleaner_node_pressure_level 2\n"), "{t}");
        assert!(
            t.contains("gleaner_node_psi_some_avg10_ratio 0.125\n"),
            "{t}"
        );
        assert!(
            t.contains("gleaner_node_errors_total{kind=\"refused_client\"} 2\n"),
            "{t}"
        );
        assert!(t.contains("gleaner_node_pools 1\n"), "{t}");
        assert!(
            t.contains("gleaner_node_pool_rebuild_seconds_total{pool=\"3\",name=\"cache\"} 1.5\n"),
            "{t}"
        );
        assert!(t.contains("gleaner_node_elastic_total_bytes 4096\n"), "{t}");
        assert!(
            t.contains(
                "gleaner_node_program_budget_bytes{program=\"5\",name=\"redis (pid 9)\"} 320\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "gleaner_node_program_loss_ratio{program=\"5\",name=\"redis (pid 9)\"} 0.25\n"
            ),
            "{t}"
        );
    }
}
