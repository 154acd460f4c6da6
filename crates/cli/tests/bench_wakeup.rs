//! `gleaner bench wakeup`: a small run of four configurations (handlers blocking in poll and in
//! read, one and one per CPU) gives a complete, self-consistent JSON report (every page touched
//! once and counted, every fault served by some handler, every handler stopped at the end).

mod common;

use std::time::Duration;

use common::run_gleaner;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);
const PAGES: u64 = 500;

/// `gleaner bench wakeup --pages PAGES --json --configs CONFIGS`, which must succeed: its report.
fn wakeup_json(configs: &str) -> Value {
    let pages = PAGES.to_string();
    let (code, out, err) = run_gleaner(
        &[
            "bench",
            "wakeup",
            "--pages",
            &pages,
            "--json",
            "--configs",
            configs,
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stderr: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn wakeup_json_is_complete_and_sane() {
    let r = wakeup_json("block-same,per-cpu,read-same,read-per-cpu");
    assert_eq!(r["pages"], PAGES);
    let cpus = r["allowed_cpus"].as_array().expect("allowed_cpus").len();
    assert!(cpus >= 1);
    let configs = r["configs"].as_array().expect("configs");
    let names: Vec<&str> = configs
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["block-same", "per-cpu", "read-same", "read-per-cpu"]
    );
    for c in configs {
        let name = c["name"].as_str().unwrap();
        assert!(c["skipped"].is_null(), "{name} skipped: {}", c["skipped"]);
        assert!(!c["description"].as_str().unwrap().is_empty(), "{name}");
        assert_eq!(c["accesses"], PAGES, "{name}: every page is touched once");
        let faults = c["faults"].as_u64().unwrap();
        assert!(faults > 0, "{name}: no faults");
        let l = &c["fault_latency"];
        assert_eq!(l["count"], faults, "{name}");
        let (mean, p50, p99, p999) = (
            l["mean_us"].as_f64().unwrap(),
            l["p50_us"].as_f64().unwrap(),
            l["p99_us"].as_f64().unwrap(),
            l["p999_us"].as_f64().unwrap(),
        );
        assert!(mean > 0.0, "{name}: mean {mean}");
        assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{name}: {l}");
        assert!(c["faults_per_s"].as_f64().unwrap() > 0.0, "{name}");
        let handlers = c["handlers"].as_array().unwrap();
        let expected_handlers = if name.ends_with("per-cpu") {
            cpus.min(16)
        } else {
            1
        };
        assert_eq!(handlers.len(), expected_handlers, "{name}");
        let served: u64 = handlers.iter().map(|h| h["served"].as_u64().unwrap()).sum();
        assert_eq!(
            served, faults,
            "{name}: served counts must add up to the faults"
        );
        for h in handlers {
            assert!(
                h["empty_wakeups"].as_u64().unwrap() <= h["wakeups"].as_u64().unwrap(),
                "{name}: {h}"
            );
        }
    }
    // Pinned to the app's CPU (0 by default).
    assert_eq!(configs[0]["handlers"][0]["cpu"], 0);
    assert_eq!(configs[2]["handlers"][0]["cpu"], 0);
}

#[test]
fn wakeup_rejects_an_unknown_configuration() {
    let (code, _, err) = run_gleaner(
        &["bench", "wakeup", "--pages", "10", "--configs", "nonesuch"],
        LIMIT,
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("nonesuch"), "{err}");
}

#[test]
fn in_thread_sigbus_serves_every_fault_itself_and_system_calls_on_missing_pages_fail() {
    let r = wakeup_json("in-thread-sigbus");
    let c = &r["configs"][0];
    assert_eq!(c["name"], "in-thread-sigbus");
    assert!(c["skipped"].is_null(), "skipped: {}", c["skipped"]);
    // Every page read back the installed data (the bench fails otherwise), and the app thread
    // itself installed every faulting page: there is no handler thread.
    assert_eq!(c["accesses"], PAGES);
    let handlers = c["handlers"].as_array().unwrap();
    assert_eq!(handlers.len(), 1, "{c}");
    assert_eq!(handlers[0]["wait"], "in-thread (SIGBUS)");
    assert_eq!(handlers[0]["cpu"], 0);
    assert_eq!(handlers[0]["served"], PAGES, "{c}");
    assert_eq!(handlers[0]["wakeups"], 0);
    // The kernel's own accesses to a missing page fail instead of waiting: why this mode is
    // not one gleaner offers (docs/compatibility.md).
    let k = &c["kernel_accesses"];
    for probe in ["read_into_missing_page", "futex_wait_on_missing_page"] {
        let got = k[probe]
            .as_str()
            .unwrap_or_else(|| panic!("{probe} missing: {c}"));
        assert!(got.starts_with("EFAULT"), "{probe}: {got}");
    }
}
