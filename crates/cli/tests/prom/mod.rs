//! Helpers of `tests/service.rs`: scraping a `/metrics` endpoint and parsing what it serves
//! with the reference Prometheus parser (`prometheus_client`, through `prom_parse.py`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Fetches `path` from `addr` over HTTP/1.1; returns (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut c = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The Python that has prometheus_client: `python3` on the PATH, else the system's (where
/// Debian's python3-prometheus-client installs it), else `python3` (whose failure then says
/// the parser is missing).
fn python() -> &'static str {
    for p in ["python3", "/usr/bin/python3"] {
        let has = Command::new(p)
            .args(["-c", "import prometheus_client"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if has {
            return p;
        }
    }
    "python3"
}

/// Parses `text` with prometheus_client's parser; panics with the parser's complaint when it
/// does not parse, and loudly when the parser is not installed.
pub fn parse(text: &str) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prom/prom_parse.py");
    let mut child = Command::new(python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/setup.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(3),
        "CANNOT CHECK: the Prometheus parser is missing: {err}"
    );
    assert!(out.status.success(), "{err}\n--- the text:\n{text}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of the sample `name` (a family's sample name) whose labels include `labels`.
pub fn value(parsed: &serde_json::Value, family: &str, labels: &[(&str, &str)]) -> f64 {
    // The parser names a counter's family without its `_total`.
    let fam = parsed
        .get(family)
        .or_else(|| parsed.get(family.strip_suffix("_total").unwrap_or(family)))
        .unwrap_or_else(|| panic!("no family {family} in {parsed}"));
    fam["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            labels
                .iter()
                .all(|(k, v)| s[1].get(*k).and_then(|x| x.as_str()) == Some(*v))
        })
        .and_then(|s| s[2].as_f64())
        .unwrap_or_else(|| panic!("no sample of {family} with {labels:?}: {fam}"))
}

/// The type a family was declared with.
pub fn kind(parsed: &serde_json::Value, family: &str) -> String {
    let fam = parsed
        .get(family)
        .or_else(|| parsed.get(family.strip_suffix("_total").unwrap_or(family)));
    fam.and_then(|f| f["type"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Checks every family has a type and a help text, and that names carry their units by
/// convention (a counter ends in `_total` in its samples).
pub fn check_conventions(parsed: &serde_json::Value) {
    for (name, fam) in parsed.as_object().unwrap() {
        let t = fam["type"].as_str().unwrap();
        assert!(t == "counter" || t == "gauge", "{name} has type {t}");
        assert!(
            !fam["help"].as_str().unwrap().is_empty(),
            "{name} has no HELP"
        );
        for s in fam["samples"].as_array().unwrap() {
            let sample = s[0].as_str().unwrap();
            assert!(sample.starts_with("gleaner_"), "{sample}");
            if t == "counter" {
                assert!(sample.ends_with("_total"), "counter sample {sample}");
            }
        }
    }
}
