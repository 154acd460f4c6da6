//! `gleaner bench micro`: a small run's JSON report is consistent, and it splits a remote fault's
//! mean, as the program saw it, into the handler's service (from the stats) and the kernel's part.

mod common;

use std::time::Duration;

use common::run_gleaner;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn micro_json_splits_a_faults_time_between_the_handler_and_the_kernel() {
    let (code, out, err) = run_gleaner(
        &[
            "bench",
            "micro",
            "--pattern",
            "random",
            "--size",
            "32M",
            "--local",
            "25%",
            "--passes",
            "1",
            "--floor-samples",
            "0",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stderr: {err}");
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(r["checksum_ok"], true);
    let remote = r["region"]["faults"]["remote"].as_u64().unwrap();
    assert!(remote > 1000, "random at 25% local must fault: {remote}");
    let b = &r["region"]["fault_breakdown"];
    let step = |k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{k}: {b}"));
    let (lookup, fetch, install) = (
        step("lookup_mean_us"),
        step("fetch_mean_us"),
        step("install_mean_us"),
    );
    assert!(lookup > 0.0 && fetch > 0.0 && install > 0.0, "{b}");
    let timed = b["timed_installs"].as_u64().unwrap();
    assert!(
        timed >= remote / 16 && timed <= remote / 4,
        "one remote fault in 8 has its install timed: {timed} of {remote}"
    );
    let service = r["handler_service_mean_us"].as_f64().unwrap();
    assert!(
        (service - (lookup + fetch + install)).abs() < 1e-6,
        "{service} is the steps' sum"
    );
    let seen = r["remote_fault_app_visible"]["mean_us"].as_f64().unwrap();
    let wait = r["fault_wait_mean_us"].as_f64().unwrap();
    assert!(
        (seen - service - wait).abs() < 1e-6,
        "{seen} = {service} + {wait}"
    );
    // The program sees a fault take longer than its handler's work on it: the kernel's exception,
    // the wake-ups and the context switches come on top.
    assert!(
        wait > 0.0,
        "a fault as the program saw it ({seen} µs) took less than its handler's service \
         ({service} µs)"
    );
}
