//! `gleaner status`: the programs running on far memory on this machine, from the status files
//! their pagers publish every second (see `gleaner_pager::status_dir`): each process's budget,
//! residency, fault rates and memnodes (for a pool: each memnode's state, extents, pages and read
//! latency, and the extents short of a replica); and, where a node daemon answers, each soft
//! pool's and elastic far program's share of local memory and the daemon's last decisions.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use gleaner_proto::units::format_size;
use serde_json::Value;

/// A status file not rewritten for this long belongs to a process that stopped or hangs.
const STALE_AFTER_S: f64 = 5.0;

/// Options of `gleaner status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the documents as one JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Print the far-memory stats in the Prometheus text format (one sample per process,
    /// labelled pid and program), e.g. for node-exporter's textfile collector:
    /// `gleaner status --prometheus > DIR/gleaner.prom.tmp && mv DIR/gleaner.prom.tmp
    /// DIR/gleaner.prom` from a timer.
    #[arg(long, conflicts_with_all = ["json", "watch"])]
    prometheus: bool,
    /// Refresh every second until interrupted.
    #[arg(long, short)]
    watch: bool,
}

/// Entry point of `gleaner status`.
pub fn main(args: StatusArgs) -> ExitCode {
    loop {
        let docs = read_all(&gleaner_pager::status_dirs());
        if args.prometheus {
            // The pagers' documents (a latency-critical reserve's is shown by the table only).
            let pagers: Vec<Value> = docs
                .iter()
                .filter(|d| d["kind"].is_null())
                .cloned()
                .collect();
            print!("{}", crate::prometheus::render(&pagers));
            return ExitCode::SUCCESS;
        }
        let node = node_state();
        if args.json {
            let mut all = docs.clone();
            if let Some(state) = &node {
                all.push(serde_json::json!({"kind": "node", "state": state}));
            }
            println!("{}", Value::Array(all));
        } else {
            if args.watch {
                print!("\x1b[2J\x1b[H"); // clear the screen, cursor home
            }
            let pagers: Vec<Value> = docs
                .iter()
                .filter(|d| d["kind"].is_null())
                .cloned()
                .collect();
            print!("{}", render(&pagers));
            print!("{}", render_hermes(&docs, node.as_ref()));
            if let Some(state) = &node {
                print!("{}", render_shares(state));
            }
        }
        if !args.watch {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Every fresh status document in `dirs`, by pid (a process's newest, if it wrote in two: one
/// that gave up root moves its file); files of processes that are gone are removed.
fn read_all(dirs: &[PathBuf]) -> Vec<Value> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut docs: Vec<Value> = dirs
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| {
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
            let pid = doc["pid"].as_u64()?;
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
                return None;
            }
            let age = now - doc["updated_unix_s"].as_f64().unwrap_or(0.0);
            (age < STALE_AFTER_S).then_some(doc)
        })
        .collect();
    let updated = |d: &Value| d["updated_unix_s"].as_f64().unwrap_or(0.0);
    docs.sort_by(|a, b| {
        a["pid"]
            .as_u64()
            .cmp(&b["pid"].as_u64())
            .then(updated(b).total_cmp(&updated(a)))
    });
    // A latency-critical process publishes its reserve beside its pager's status: one of each.
    docs.sort_by_key(|d| d["kind"].as_str().map(str::to_string));
    docs.dedup_by(|later, first| later["pid"] == first["pid"] && later["kind"] == first["kind"]);
    docs
}

/// The latency-critical processes' reserves and the node daemon's batch reclaimer (Hermes).
fn render_hermes(docs: &[Value], node: Option<&Value>) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let mut out = String::new();
    let lc: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "latency_critical")
        .collect();
    if !lc.is_empty() {
        out += &format!(
            "\nlatency-critical reserves\n{:>8}  {:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
            "PID", "PROGRAM", "RESERVE", "BOUND", "LOCKED", "HITS", "MISSES", "FALLBACK"
        );
        for d in lc {
            let r = &d["reserve"];
            out += &format!(
                "{:>8}  {:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
                n(&d["pid"]),
                d["program"].as_str().unwrap_or("?"),
                format_size(n(&r["reserve_bytes"])),
                format_size(n(&r["bound_bytes"])),
                format_size(n(&r["locked_bytes"])),
                n(&r["hits"]),
                n(&r["misses"]),
                n(&r["fallbacks"]),
            );
        }
    }
    if let Some(b) = node.map(|s| &s["batch"]).filter(|b| b.is_object()) {
        let count = |k: &str| b[k].as_array().map_or(0, |a| a.len());
        out += &format!(
            "\nnode daemon: {} batch, {} latency-critical process(es); watermark {} (latency-critical \
             growth {}/s); {} page-cache drops, {} dropped\n",
            count("batch_pids"),
            count("latency_critical_pids"),
            format_size(n(&b["watermark_bytes"])),
            format_size(b["lc_alloc_bytes_per_s"].as_f64().unwrap_or(0.0) as u64),
            n(&b["drops"]),
            format_size(n(&b["dropped_bytes"])),
        );
        if let Some(mode) = b["mode"].as_str() {
            out += &format!(
                "  reclaim: {mode}, at most every {:.2} s now\n",
                b["reclaim_interval_s"].as_f64().unwrap_or(0.0)
            );
        }
        for cg in b["cgroups"].as_array().into_iter().flatten() {
            out += &format!(
                "  cgroup {} marked {}: {} process(es)\n",
                cg["path"].as_str().unwrap_or("?"),
                cg["class"].as_str().unwrap_or("?"),
                n(&cg["processes"]),
            );
        }
    }
    out
}

/// The node daemon's local-memory shares: each elastic far program's and soft pool's grant and
/// share of what the daemon hands out, and its last decisions (at most five).
fn render_shares(node: &Value) -> String {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let empty = |k: &str| node[k].as_array().is_none_or(|a| a.is_empty());
    if empty("programs") && empty("pools") {
        return String::new();
    }
    let mut out = format!(
        "\nnode daemon (pid {}, policy {}): {} of local memory to share, pressure {}\n\
         {:>5}  {:<12} {:<24} {:>10} {:>6} {:>10} {:>21}  {}\n",
        n(&node["pid"]),
        node["policy"].as_str().unwrap_or("?"),
        format_size(n(&node["elastic_total"])),
        node["level"].as_str().unwrap_or("?"),
        "ID",
        "KIND",
        "NAME",
        "GRANT",
        "SHARE",
        "HOLDS",
        "RANGE",
        "LOSS / UTILITY"
    );
    // One row per claimant: what it is granted and holds, its range, and why it gets what it
    // gets (a program's loss, a pool's utility).
    let row = |p: &Value, kind: &str, holds: &Value, why: String| {
        format!(
            "{:>5}  {:<12} {:<24} {:>10} {:>5.1}% {:>10} {:>21}  {why}\n",
            n(&p["id"]),
            kind,
            p["name"].as_str().unwrap_or("?"),
            format_size(n(&p["limit"])),
            100.0 * f(&p["share"]),
            format_size(n(holds)),
            format!(
                "{}..{}",
                format_size(n(&p["floor"])),
                format_size(n(&p["ceiling"]))
            ),
        )
    };
    for p in node["programs"].as_array().into_iter().flatten() {
        out += &row(
            p,
            "program",
            &p["budget_applied"],
            format!(
                "{:.1} ms/s lost to far faults ({:.0} us each)",
                f(&p["loss_ns_per_s"]) / 1e6,
                f(&p["fault_cost_ns"]) / 1e3
            ),
        );
    }
    for p in node["pools"].as_array().into_iter().flatten() {
        let utility = p["utility"]
            .as_f64()
            .map_or("-".to_string(), |u| format!("utility {u:.3}"));
        out += &row(p, "soft pool", &p["resident"], utility);
    }
    let decisions = node["decisions"].as_array().map_or(&[][..], |d| &d[..]);
    if !decisions.is_empty() {
        out += "last decisions:\n";
    }
    for d in decisions.iter().rev().take(5) {
        for c in d["changes"].as_array().into_iter().flatten() {
            let who = if c["program"].is_null() {
                format!("pool {}", n(&c["pool"]))
            } else {
                format!("program {}", n(&c["program"]))
            };
            out += &format!(
                "  at {} ms: {who} ({}) {} -> {}: {}\n",
                n(&d["at_ms"]),
                c["name"].as_str().unwrap_or("?"),
                format_size(n(&c["from"])),
                format_size(n(&c["to"])),
                c["why"].as_str().unwrap_or(""),
            );
        }
    }
    out
}

/// The node daemon's state, if one answers on the default socket.
fn node_state() -> Option<Value> {
    gleaner_node::client::status(&gleaner_node::client::default_socket()).ok()
}

/// The table `gleaner status` prints.
fn render(docs: &[Value]) -> String {
    if docs.is_empty() {
        return "no program is running on far memory (gleaner run) on this machine\n".into();
    }
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let page = gleaner_proto::PAGE_SIZE as u64;
    let mut out = format!(
        "{:>8}  {:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  memnode\n",
        "PID", "PROGRAM", "BUDGET", "RESIDENT", "FAR", "FAULTS/s", "ZEROFL/s", "EVICT/s"
    );
    for d in docs {
        let s = &d["stats"];
        let rate = |k: &str| {
            d["per_second"][k]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.0}"))
        };
        out += &format!(
            "{:>8}  {:<16} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}  {}\n",
            n(&d["pid"]),
            d["program"].as_str().unwrap_or("?"),
            format_size(n(&s["budget_pages"]) * page),
            format_size(n(&s["resident_pages"]) * page),
            format_size(n(&s["remote_pages"]) * page),
            rate("remote_faults"),
            rate("zero_fills"),
            rate("evictions"),
            s["memnode"].as_str().unwrap_or("?"),
        );
        let pool = &s["store"]["pool"];
        if pool.is_object() {
            out += &format!(
                "{:>10}{} replica(s); {} extent(s) short of a replica, {} repaired ({} pages)\n",
                "",
                n(&pool["replicas"]),
                n(&pool["extents_degraded"]),
                n(&pool["extents_repaired"]),
                n(&pool["pages_repaired"]),
            );
            for m in pool["memnodes"].as_array().into_iter().flatten() {
                let state = if m["drained"] == true {
                    "drained".to_string()
                } else if m["alive"] != true {
                    format!("LOST: {}", m["lost_because"].as_str().unwrap_or("?"))
                } else if m["draining"] == true {
                    "draining".to_string()
                } else {
                    "ok".to_string()
                };
                out += &format!(
                    "{:>10}{:<24} {:<8} {:>4} extents {:>9} pages written {:>9} read, {:.0} us/read\n",
                    "",
                    m["endpoint"].as_str().unwrap_or("?"),
                    state,
                    n(&m["extents"]),
                    n(&m["pages_written"]),
                    n(&m["pages_read"]),
                    m["read_us"].as_f64().unwrap_or(0.0),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(pid: u64, pool: Value) -> Value {
        json!({"pid": pid, "program": "memcached", "updated_unix_s": 1.0,
               "per_second": {"remote_faults": 1234.0, "zero_fills": 5.0, "evictions": 99.0},
               "stats": {"budget_pages": 256, "resident_pages": 200, "remote_pages": 1024,
                         "memnode": "a pool of 3 memnodes", "store": {"pool": pool}}})
    }

    #[test]
    fn the_table_shows_rates_and_each_memnode() {
        let pool = json!({"replicas": 2, "extents_degraded": 1, "extents_repaired": 3,
            "pages_repaired": 4096, "memnodes": [
                {"endpoint": "m1:7070", "alive": true, "extents": 5, "pages_written": 10,
                 "pages_read": 7, "read_us": 41.2},
                {"endpoint": "m2:7070", "alive": false, "lost_because": "refused",
                 "extents": 0},
                {"endpoint": "m3:7070", "alive": false, "drained": true, "extents": 0}]});
        let t = render(&[doc(42, pool)]);
        assert!(t.contains("memcached"), "{t}");
        assert!(t.contains("1.00 MiB"), "budget: {t}");
        assert!(t.contains("4.00 MiB"), "far: {t}");
        assert!(t.contains("1234"), "{t}");
        assert!(
            t.contains("1 extent(s) short of a replica, 3 repaired (4096 pages)"),
            "{t}"
        );
        assert!(t.contains("LOST: refused"), "{t}");
        assert!(t.contains("drained"), "{t}");
        assert!(t.contains("41 us/read"), "{t}");
        assert!(render(&[]).contains("no program is running"));
    }

    #[test]
    fn the_daemon_s_shares_and_decisions_are_shown() {
        let node = json!({"pid": 7, "policy": "midas", "elastic_total": 512u64 << 20,
            "level": "none",
            "programs": [{"id": 3, "name": "big (pid 10)", "limit": 384u64 << 20, "share": 0.75,
                          "budget_applied": 320u64 << 20, "floor": 64u64 << 20,
                          "ceiling": 448u64 << 20, "loss_ns_per_s": 12.5e6,
                          "fault_cost_ns": 20000.0}],
            "pools": [{"id": 4, "name": "cache", "limit": 128u64 << 20, "share": 0.25,
                       "resident": 100u64 << 20, "floor": 0, "ceiling": 1u64 << 30,
                       "utility": 0.5}],
            "decisions": [{"at_ms": 1000, "changes": [{"program": 3, "name": "big (pid 10)",
                "from": 320u64 << 20, "to": 384u64 << 20, "why": "+64 MiB from 5"}]}]});
        let t = render_shares(&node);
        assert!(t.contains("512.00 MiB of local memory to share"), "{t}");
        assert!(t.contains("big (pid 10)") && t.contains("75.0%"), "{t}");
        assert!(
            t.contains("12.5 ms/s lost to far faults (20 us each)"),
            "{t}"
        );
        assert!(t.contains("64.00 MiB..448.00 MiB"), "{t}");
        assert!(t.contains("soft pool") && t.contains("25.0%"), "{t}");
        assert!(
            t.contains("100.00 MiB") && t.contains("utility 0.500"),
            "{t}"
        );
        assert!(
            t.contains("program 3 (big (pid 10)) 320.00 MiB -> 384.00 MiB: +64 MiB from 5"),
            "{t}"
        );
        assert!(render_shares(&json!({"programs": [], "pools": []})).is_empty());
    }
}
