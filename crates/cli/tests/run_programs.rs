//! `gleaner run` end to end: a real C program (tests/c/preload_program.c, which knows nothing of
//! gleaner) under `LD_PRELOAD`, with real userfaultfd and a real memnode, at budgets well below
//! what it uses. Every mode verifies its own data and exits non-zero on any difference.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    gleaner_bin, memnodes_sharing_a_token, preload_program as program, run_gleaner, wait_output,
    MemnodeProc, TempDir,
};

const LIMIT: Duration = Duration::from_secs(120);

fn preload_library_is_built() {
    let lib = gleaner_bin()
        .parent()
        .unwrap()
        .join("libgleaner_preload.so");
    assert!(
        lib.exists(),
        "{} is missing: build the workspace first (cargo build --release), as scripts/test.sh does",
        lib.display()
    );
}

/// `gleaner run --local-mem LOCAL --stats FILE -- program MODE MB`; returns (status, stdout,
/// stderr, stats JSON).
fn run_program(
    local: &str,
    mode: &str,
    mb: &str,
    extra: &[&str],
) -> (Option<i32>, String, String, serde_json::Value) {
    preload_library_is_built();
    run_with_stats(local, extra, &[program(), mode, mb])
}

/// [`run_program`] at 16M with a shell's `ulimit LIMIT` set first (`-n 256`, `-v 3000000`).
fn run_program_under_ulimit(
    limit: &str,
    mode: &str,
    mb: &str,
) -> (Option<i32>, String, String, serde_json::Value) {
    preload_library_is_built();
    let script = format!("ulimit {limit} && exec {} {mode} {mb}", program());
    run_with_stats("16M", &[], &["sh", "-c", &script])
}

/// Runs `command` under `gleaner run --local-mem LOCAL EXTRA.. --stats FILE`; returns its
/// status, stdout and stderr, and the stats file (`Null` if none was written).
fn run_with_stats(
    local: &str,
    extra: &[&str],
    command: &[&str],
) -> (Option<i32>, String, String, serde_json::Value) {
    let dir = TempDir::new("run");
    let stats = dir.path().join("stats.json");
    let stats_s = stats.to_string_lossy().into_owned();
    let mut args = vec!["run", "--local-mem", local, "--stats", &stats_s];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    let (code, out, err) = run_gleaner(&args, LIMIT);
    let json = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (code, out, err, json)
}

/// The number that follows `label` in a program's output (what the program counted).
fn number_after(out: &str, label: &str) -> u32 {
    out.split(label)
        .nth(1)
        .and_then(|k| k.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `{label}N` in: {out}"))
}

fn pages(bytes: u64) -> u64 {
    bytes / 4096
}

#[test]
fn mixed_allocator_and_mapping_calls_keep_every_byte() {
    // 4 threads, 96 MiB of heap blocks and mappings, 12 MiB local.
    let (code, out, err, stats) = run_program("12M", "mixed", "96", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    let t = &stats["total"];
    assert_eq!(t["process_count"], 1, "{stats}");
    // The data really went to the memnode and came back.
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(48 << 20),
        "{stats}"
    );
    assert!(
        t["faults"]["remote"].as_u64().unwrap() > pages(48 << 20),
        "{stats}"
    );
    // munmap/madvise/free released memory through the pager.
    assert!(t["discarded_pages"].as_u64().unwrap() > 0, "{stats}");
    assert!(
        err.contains("gleaner run: "),
        "the summary is printed: {err}"
    );
}

/// `--evict-batch N` sizes every eviction batch: the batches take N pages at most (so more
/// batches for the same evictions than the default's 128), and every byte still comes back.
#[test]
fn evict_batch_sets_the_pages_each_batch_takes_and_keeps_every_byte() {
    let (code, out, err, stats) = run_program("12M", "mixed", "48", &["--evict-batch", "8"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    let e = &stats["total"]["evictions"];
    let pages = e["clean"].as_u64().unwrap() + e["dirty"].as_u64().unwrap();
    let batches = e["batches"].as_u64().unwrap();
    assert!(pages > 2000, "the run evicted: {stats}");
    // Raced writes and aborted batches aside, a batch evicts what it took: at most 8 pages.
    assert!(
        batches * 8 >= pages,
        "{pages} pages in {batches} batches: {stats}"
    );
    // Out of range: a clear error before anything runs.
    let (code, _, err, _) = run_program("12M", "mixed", "48", &["--evict-batch", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--evict-batch"), "{err}");
}

/// Small blocks of every size, freed, reused, reallocated across size classes and checked after
/// a trip to the memnode; one size's blocks pack together (the heap's size classes); a fork
/// child allocates too.
#[test]
fn small_blocks_of_every_size_class_keep_every_byte() {
    let (code, out, err, stats) = run_program("12M", "small", "64", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("small ok"), "{out}");
    let t = &stats["total"];
    assert!(
        t["faults"]["remote"].as_u64().unwrap() > pages(16 << 20),
        "the blocks should have gone to the memnode and come back: {stats}"
    );
}

/// The `rss_anon_kb` the fork program printed for `who` (`parent` or `child`), in MiB.
fn rss_mib(out: &str, who: &str) -> f64 {
    let prefix = format!("{who} rss_anon_kb ");
    let kb: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {who} RSS in: {out}"))
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// The budget check shared by both fork modes: the parent went back under its budget after
/// the fork (evicting again), and its data went to the memnode before it.
fn assert_parent_back_under_budget(stats: &serde_json::Value) {
    let t = &stats["total"];
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(32 << 20),
        "{stats}"
    );
    let p = &stats["processes"][0]["stats"];
    let (resident, budget) = (
        p["resident_pages"].as_u64().unwrap(),
        p["budget_pages"].as_u64().unwrap(),
    );
    assert!(
        resident <= budget,
        "resident {resident} > budget {budget}: {stats}"
    );
}

/// The parent (the lower pid) closed its copy of the pipe whose other end its fork child held,
/// so the child's exit freed the blobs kept for the child's snapshot: the parent, which
/// rewrote its memory after the child had gone, holds none at its own exit.
fn assert_parent_holds_nothing_for_its_gone_child(stats: &serde_json::Value) {
    let parent = stats["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .min_by_key(|p| p["pid"].as_u64())
        .expect("a process");
    assert_eq!(
        parent["stats"]["store"]["blobs_held_for_children"], 0,
        "{parent}"
    );
}

/// 80 MiB filled at a 16 MiB budget: most of it is on the memnode when fork comes. The child
/// gets a pager of its own (4 MiB, a quarter of the parent's budget) reading the far pages as
/// they were at the fork, while the parent rewrites all of them and frees a quarter (the
/// snapshot must hold their old blobs for the child): both see exactly their own memory, and
/// neither brings the heap home: private resident memory stays near each one's budget.
#[test]
fn fork_child_pages_from_a_snapshot_of_the_fork_moment() {
    let (code, out, err, stats) = run_program("16M", "fork", "64", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("fork ok"), "{out}");
    assert_parent_back_under_budget(&stats);
    assert_parent_holds_nothing_for_its_gone_child(&stats);
    // The child ends with `_exit`, and still writes its stats: it read the parent's far pages
    // and evicted its own, and the run's totals count it (the parent's pid is the lower).
    assert_eq!(stats["total"]["process_count"], 2, "{stats}");
    let child = &stats["processes"][1]["stats"];
    assert!(
        child["bytes_in"].as_u64().unwrap() > 32 << 20,
        "the child's reads of the snapshot (80 MiB checked): {child}"
    );
    assert!(
        child["evictions"]["dirty"].as_u64().unwrap()
            + child["evictions"]["clean"].as_u64().unwrap()
            > 0,
        "the child's evictions at its 4 MiB budget: {child}"
    );
    // Budget, eviction overflow and the program's own non-heap memory (a few MiB): far below
    // the 80 MiB a fork that brought the pages home leaves in each.
    let (parent, child) = (rss_mib(&out, "parent"), rss_mib(&out, "child"));
    assert!(
        parent < 16.0 * 1.25 + 8.0,
        "parent RssAnon {parent:.1} MiB: {out}"
    );
    assert!(
        child < 4.0 * 1.25 + 8.0,
        "child RssAnon {child:.1} MiB: {out}"
    );
    // The child's budget can be chosen.
    let (code, out, err, _) = run_program("16M", "fork", "64", &["--fork-local-mem", "12M"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let child = rss_mib(&out, "child");
    assert!(
        child > 8.0 && child < 12.0 * 1.25 + 8.0,
        "child RssAnon {child:.1} MiB at a 12 MiB budget: {out}"
    );
}

/// A fork child's own memnode session (for the slabs its write-backs go to) is opened at its
/// first write-back: a shell's fork children, which exit or exec before they evict anything,
/// open none, while a child that evicts (the fork program's, over its budget) opens one and
/// keeps every byte.
#[test]
fn a_fork_child_opens_its_memnode_session_only_when_it_writes_back() {
    preload_library_is_built();
    let node = MemnodeProc::start("unix", "512M");
    let addr = node.endpoint.to_string();
    let token = node.token_file.to_string_lossy().into_owned();
    let created = || {
        let (c, stats, e) = run_gleaner(
            &["memnode", "stats", "--addr", &addr, "--token-file", &token],
            LIMIT,
        );
        assert_eq!(c, Some(0), "{e}");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        v["totals"]["sessions_created"].as_u64().unwrap()
    };
    let shell = |script: &str| {
        let before = created();
        let (code, out, err) = run_gleaner(
            &[
                "run",
                "--local-mem",
                "64M",
                "--memnode",
                &addr,
                "--token-file",
                &token,
                "--",
                "bash",
                "-c",
                script,
            ],
            LIMIT,
        );
        assert_eq!(code, Some(0), "{script}: stdout: {out}\nstderr: {err}");
        created() - before
    };
    // One exec'd process (whatever the run itself opens besides), then the same with eight
    // subshells and eight fork-and-execs of /bin/true: sixteen fork children, eight more
    // exec'd processes.
    let alone = shell("/bin/true");
    let looped = shell("/bin/true; for i in 1 2 3 4 5 6 7 8; do ( : ); /bin/true; done");
    assert_eq!(
        looped,
        alone + 8,
        "sessions opened: {alone} for one /bin/true, {looped} with 16 fork children and 8 more \
         execs (only the execs may add one each)"
    );
    let before = created();
    let (code, out, err, _) = run_program(
        "16M",
        "fork",
        "64",
        &["--memnode", &addr, "--token-file", &token],
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("fork ok"), "{out}");
    assert!(
        created() - before >= 2,
        "the parent and its evicting child each opened a session"
    );
}

/// Over TCP each memnode copies its session for the child (`Fork`), for one memnode and for a
/// pool of two: the same as with shared memory, every byte right and neither process bringing
/// the heap home.
#[test]
fn fork_over_tcp_and_a_pool_pages_from_the_memnodes_copies_of_the_session() {
    let (nodes, dir) = memnodes_sharing_a_token(2, "256M");
    let token = dir.path().join("token").to_string_lossy().into_owned();
    let one = nodes[0].endpoint.to_string();
    let pool = format!("{},{}", nodes[0].endpoint, nodes[1].endpoint);
    for memnodes in [&one, &pool] {
        let (code, out, err, stats) = run_program(
            "16M",
            "fork",
            "64",
            &["--memnode", memnodes, "--token-file", &token],
        );
        assert_eq!(code, Some(0), "{memnodes}: stdout: {out}\nstderr: {err}");
        assert_parent_back_under_budget(&stats);
        let (parent, child) = (rss_mib(&out, "parent"), rss_mib(&out, "child"));
        assert!(
            parent < 16.0 * 1.25 + 8.0,
            "{memnodes}: parent RssAnon {parent:.1} MiB: {out}"
        );
        assert!(
            child < 4.0 * 1.25 + 8.0,
            "{memnodes}: child RssAnon {child:.1} MiB: {out}"
        );
        assert!(
            !err.contains("brings this process's far pages home"),
            "{err}"
        );
    }
}

/// `--fork home`, and a memnode with no room to copy the session (`Fork` refused: Full), bring
/// every page home before the fork: the child, without a pager, still sees exactly the fork
/// moment's memory, at the cost of the whole heap in local memory; the refused copy is announced.
#[test]
fn fork_that_brings_pages_home_keeps_every_byte_and_says_so_when_the_memnode_is_full() {
    let (code, out, err, stats) = run_program("16M", "fork", "64", &["--fork", "home"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert_parent_back_under_budget(&stats);
    assert!(rss_mib(&out, "child") > 64.0, "the heap came home: {out}");
    assert!(!err.contains("far pages home"), "{err}");

    // About 64 MiB of incompressible pages on the memnode: a copy does not fit in 100 MiB.
    let node = MemnodeProc::start("127.0.0.1:0", "100M");
    let addr = node.endpoint.to_string();
    let token = node.token_file.to_string_lossy().into_owned();
    let (code, out, err, stats) = run_program(
        "16M",
        "fork",
        "64",
        &["--memnode", &addr, "--token-file", &token],
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert_parent_back_under_budget(&stats);
    assert!(rss_mib(&out, "child") > 64.0, "the heap came home: {out}");
    assert!(
        err.contains("this fork brings the far pages home") && err.contains("full"),
        "the fallback is announced: {err}"
    );
}

#[test]
fn exec_starts_a_fresh_far_memory_process() {
    let (code, out, err, stats) = run_program("8M", "exec", "32", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "the exec'd image ran: {out}");
    // The exec'd image has its own region (the first image ends at exec, writing nothing).
    assert_eq!(stats["total"]["process_count"], 1, "{stats}");
}

#[test]
fn exit_from_a_thread_ends_the_run_cleanly() {
    let (code, out, err, stats) = run_program("8M", "thread-exit", "32", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("thread-exit ok"), "{out}");
    assert!(
        stats["total"]["faults"]["remote"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

/// `preload_program sigterm 32` under `gleaner run --local-mem 8M`, once it has filled its
/// memory and waits (it printed `ready`).
fn start_waiting_program() -> std::process::Child {
    preload_library_is_built();
    spawned_until(
        Command::new(gleaner_bin()).args([
            "run",
            "--local-mem",
            "8M",
            "--",
            program(),
            "sigterm",
            "32",
        ]),
        "ready",
    )
}

/// Spawns `cmd` with its output piped and returns once it has printed a line containing
/// `marker`. What it printed until then is consumed, and so may be some output after that
/// line (read ahead into the buffer); the rest is left in its stdout.
fn spawned_until(cmd: &mut Command, marker: &str) -> std::process::Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(marker) {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the program ended before it printed `{marker}`"
        );
    }
    child.stdout = Some(stdout.into_inner());
    child
}

#[test]
fn sigterm_is_forwarded_and_the_exit_status_too() {
    let mut child = start_waiting_program();
    // SAFETY: kill(2) on the launcher we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not end after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // 42 is what the program returns from main after its SIGTERM handler ran and its data
    // checked out; the launcher passes it through.
    assert_eq!(status.code(), Some(42));
}

/// Core dumps leave out the managed reservation's part never carved and the shared-memory
/// slabs (sealed blobs), and keep the memory the program uses. A core dump took every private
/// mapping whole: a crash wrote a 64 GiB core (sparse on disk, but a crash handler reading a
/// pipe is sent every zero). Read from `/proc/PID/smaps` (`dd`: left out of core dumps) while the
/// program waits, so that it does not depend on the machine's core pattern.
/// The program's pid: not the embedded memnode (`gleaner`), among the launcher's children.
fn program_pid(launcher: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children"))
        .unwrap()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|p: &u32| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() != "gleaner")
        })
        .expect("the program runs")
}

/// No pager thread runs at the idle scheduling class (`SCHED_IDLE`): a process ends only once
/// each of its threads has run to its end, and on a busy machine an idle-class thread waits
/// long for the CPU to do it. The eviction watchdog was one: a process killed with `SIGKILL`
/// beside two busy loops was reaped 0.3-1.3 s later (plain: 2-7 ms), and CPython's
/// `test_leak_fast_process_del_killed`, which gives it 0.2 s, failed under load. It now runs at
/// `SCHED_BATCH` (it still never preempts a thread on waking).
#[test]
fn no_pager_thread_runs_at_the_idle_scheduling_class() {
    let mut child = start_waiting_program();
    let pid = program_pid(child.id());
    let mut seen = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let path = task.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // Field 41 of stat is the policy; the fields after the command's `)` start at field 3.
        let policy: i32 = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(41 - 3))
            .and_then(|f| f.parse().ok())
            .expect("a policy field");
        seen.push((name.trim().to_string(), policy));
    }
    // SAFETY: kill(2) on the launcher we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(42));
    assert!(
        seen.iter()
            .any(|(n, p)| n == "gleaner-watch" && *p == libc::SCHED_BATCH),
        "the watchdog at SCHED_BATCH: {seen:?}"
    );
    assert!(
        seen.iter()
            .filter(|(n, _)| n.starts_with("gleaner-"))
            .count()
            >= 3,
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|(_, p)| *p == libc::SCHED_IDLE),
        "a thread at SCHED_IDLE: {seen:?}"
    );
}

#[test]
fn core_dumps_leave_out_unused_far_memory_and_the_slabs() {
    let mut child = start_waiting_program();
    let launcher = child.id();
    let pid = program_pid(launcher);
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    // SAFETY: kill(2) on the launcher we spawned.
    unsafe { libc::kill(launcher as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(42));
    // Each mapping: its header line, its size and resident kB, whether it is left out.
    let mut maps: Vec<(String, u64, u64, bool)> = Vec::new();
    for l in smaps.lines() {
        let field = |name: &str| {
            l.strip_prefix(name)
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        };
        if let Some(kb) = field("Size:") {
            maps.last_mut().unwrap().1 = kb;
        } else if let Some(kb) = field("Rss:") {
            maps.last_mut().unwrap().2 = kb;
        } else if let Some(flags) = l.strip_prefix("VmFlags:") {
            maps.last_mut().unwrap().3 = flags.split_whitespace().any(|f| f == "dd");
        } else if l.split_whitespace().next().is_some_and(|r| r.contains('-')) {
            maps.push((l.to_string(), 0, 0, false));
        }
    }
    let gib = |kb: u64| kb as f64 / (1 << 20) as f64;
    let left_out: u64 = maps.iter().filter(|m| m.3).map(|m| m.1).sum();
    let kept: u64 = maps.iter().filter(|m| !m.3).map(|m| m.1).sum();
    assert!(
        gib(left_out) > 16.0 && gib(kept) < 4.0,
        "left out of core dumps {:.1} GiB, kept {:.1} GiB:\n{smaps}",
        gib(left_out),
        gib(kept)
    );
    // What the program uses is kept: the resident private memory left out is the slabs only.
    let resident_left_out: u64 = maps
        .iter()
        .filter(|m| m.3 && !m.0.contains("memfd:"))
        .map(|m| m.2)
        .sum();
    assert!(
        resident_left_out < 1024,
        "{resident_left_out} kB resident left out:\n{smaps}"
    );
    assert!(
        maps.iter().filter(|m| m.0.contains("memfd:")).all(|m| m.3),
        "slabs kept in core dumps:\n{smaps}"
    );
}

#[test]
fn a_crashing_program_gets_its_status_and_the_memnode_reclaims_its_session() {
    let node = MemnodeProc::start_short_lease("unix", "256M");
    let addr = node.endpoint.to_string();
    let token = node.token_file.to_string_lossy().into_owned();
    let (code, out, err, _) = run_program(
        "8M",
        "crash",
        "48",
        &["--memnode", &addr, "--token-file", &token],
    );
    assert_eq!(
        code,
        Some(128 + libc::SIGSEGV),
        "stdout: {out}\nstderr: {err}"
    );
    assert!(err.contains("killed by signal 11 (SIGSEGV)"), "{err}");
    // The memnode held the crashed program's pages; they are released once its lease (here
    // short) runs out.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = true;
    loop {
        let (c, stats, e) = run_gleaner(
            &["memnode", "stats", "--addr", &addr, "--token-file", &token],
            LIMIT,
        );
        assert_eq!(c, Some(0), "{e}");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        if first {
            // Over a Unix socket the pages went into shared-memory slabs (the memnode sees the
            // memory they occupy); over the socket data path they were written to it.
            let written = v["totals"]["pages_written"].as_u64().unwrap();
            let held = v["host_bytes"].as_u64().unwrap() / 4096;
            assert!(
                written.max(held) > pages(32 << 20),
                "the program's pages reached the memnode: {v}"
            );
            first = false;
        }
        if v["used_bytes"] == 0 {
            assert!(
                v["totals"]["sessions_released_by_lease"].as_u64().unwrap() >= 1,
                "{v}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the crashed program's pages were never released: {v}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn more_than_budget_plus_memnode_capacity_is_a_clear_error() {
    let (code, out, err, _) = run_program("8M", "hog", "256", &["--memnode-capacity", "32M"]);
    assert_eq!(code, Some(86), "stdout: {out}\nstderr: {err}");
    assert!(err.contains("the memnode is full"), "{err}");
    assert!(err.contains("zero-filled pages"), "{err}");
    assert!(!out.contains("allocated everything"), "{out}");
}

/// A helper whose far memory fails while it runs (the memnode full) is stopped with exit 86; a
/// script that carries on past it and exits 0 does not make the run succeed: the run exits 86,
/// says which process was stopped and why, and its stats count it. (Before, the run exited 0,
/// and a script that hid the helper's output hid the failure entirely.)
#[test]
fn a_process_stopped_mid_run_fails_the_run_although_its_script_exits_0() {
    preload_library_is_built();
    let script = format!("{} hog 256; echo script went on after $?", program());
    let dir = TempDir::new("midrun");
    let stats = dir.path().join("stats.json");
    let stats_s = stats.to_string_lossy().into_owned();
    let (code, out, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode-capacity",
            "32M",
            "--stats",
            &stats_s,
            "--",
            "sh",
            "-c",
            &script,
        ],
        LIMIT,
    );
    assert!(out.contains("script went on after 86"), "{out}\n{err}");
    assert_eq!(code, Some(86), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains(
            "1 process was stopped (exit 86) because far memory failed while it ran; first: \
             gleaner_preload_program"
        ),
        "{err}"
    );
    assert!(err.contains("the run fails (exit 86)"), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(
        json["far_memory_processes"]["stopped_pager_failed"], 0,
        "{json}"
    );
    assert_one_stopped(&json, "stopped_mid_run", "stops", "the memnode is full");
}

/// The run failed (exit 86) for one stopped process, which `--stats` counts under `count` and
/// names first in `list`, with `reason` in its error.
fn assert_one_stopped(stats: &serde_json::Value, count: &str, list: &str, reason: &str) {
    let procs = &stats["far_memory_processes"];
    assert_eq!(procs[count], 1, "{stats}");
    assert!(
        procs[list][0]["error"].as_str().unwrap().contains(reason),
        "{stats}"
    );
    assert_eq!(stats["exit_status"], 86, "{stats}");
}

#[test]
fn bad_input_command_not_found() {
    preload_library_is_built();
    let (code, _, err) = run_gleaner(
        &["run", "--local-mem", "8M", "--", "no-such-program-xyz"],
        LIMIT,
    );
    assert_eq!(code, Some(127), "{err}");
    assert!(
        err.contains("command not found: no-such-program-xyz"),
        "{err}"
    );
}

#[test]
fn bad_input_memnode_unreachable() {
    preload_library_is_built();
    let dir = TempDir::new("unreach");
    let token = dir.path().join("token");
    gleaner_proto::write_token_file(&token, &gleaner_proto::generate_token()).unwrap();
    let sock = format!("unix:{}", dir.path().join("nobody-listens.sock").display());
    let (code, _, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &sock,
            "--token-file",
            token.to_str().unwrap(),
            "--",
            "true",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot reach the memnode at"), "{err}");
    assert!(err.contains("nobody-listens.sock"), "{err}");
}

#[test]
fn bad_input_wrong_token() {
    let node = MemnodeProc::start("127.0.0.1:0", "64M");
    let dir = TempDir::new("wrongtok");
    let token = dir.path().join("token");
    gleaner_proto::write_token_file(&token, &gleaner_proto::generate_token()).unwrap();
    let (code, _, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &node.endpoint.to_string(),
            "--token-file",
            token.to_str().unwrap(),
            "--",
            "true",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.to_lowercase().contains("token"), "{err}");
}

#[test]
fn bad_input_budget_too_small() {
    let (code, _, err) = run_gleaner(&["run", "--local-mem", "64K", "--", "true"], LIMIT);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("too small to make progress"), "{err}");
}

#[test]
fn bad_input_decode_budget() {
    for bad in ["0", "--max-decode-us=-1", "fast"] {
        let flag = if bad.starts_with("--") {
            vec![bad]
        } else {
            vec!["--max-decode-us", bad]
        };
        let args: Vec<&str> = ["run"]
            .into_iter()
            .chain(flag)
            .chain(["--", "true"])
            .collect();
        let (code, _, err) = run_gleaner(&args, LIMIT);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("is not a decode budget"), "{bad}: {err}");
    }
}

#[test]
fn bad_input_userfaultfd_not_permitted() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test switches to `nobody` and must run as root (CI does)"
    );
    preload_library_is_built();
    let sysctl = "/proc/sys/vm/unprivileged_userfaultfd";
    let before = std::fs::read_to_string(sysctl).unwrap();
    if before.trim() != "0" {
        std::fs::write(sysctl, "0").unwrap();
    }
    let dir = TempDir::new("nobody-run");
    let bin_dir = gleaner_bin().parent().unwrap().to_path_buf();
    for f in ["gleaner", "libgleaner_preload.so"] {
        std::fs::copy(bin_dir.join(f), dir.path().join(f)).unwrap();
    }
    for p in [
        dir.path().to_path_buf(),
        dir.path().join("gleaner"),
        dir.path().join("libgleaner_preload.so"),
    ] {
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(dir.path().join("gleaner"))
        .args(["run", "--local-mem", "8M", "--", "true"])
        .env("HOME", "/nonexistent")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let (code, _, err) = wait_output(&mut child, LIMIT);
    if before.trim() != "0" {
        std::fs::write(sysctl, before.trim()).unwrap();
    }
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("userfaultfd is not permitted"), "{err}");
    assert!(err.contains("vm.unprivileged_userfaultfd=1"), "{err}");
}

#[test]
fn preload_library_alone_prints_its_configuration() {
    preload_library_is_built();
    let lib = gleaner_bin()
        .parent()
        .unwrap()
        .join("libgleaner_preload.so");
    let out = Command::new(program())
        .args(["mixed", "8"])
        .env("LD_PRELOAD", &lib)
        .env("GLEANER_LOCAL_MEM", "4M")
        .env("GLEANER_PRINT_CONFIG", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("gleaner: local 4.00 MiB | memnode embedded"),
        "{err}"
    );
}

/// The policy flags of `gleaner run` reach the pager of the program it starts.
#[test]
fn policy_flags_reach_the_program() {
    let dir = TempDir::new("flags");
    let trace = dir.path().join("trace-%p.jsonl");
    let trace_s = trace.to_string_lossy().into_owned();
    let (code, out, err, stats) = run_program(
        "12M",
        "mixed",
        "64",
        &[
            "--predict-writes",
            "off",
            "--reclaim",
            "static:1",
            "--evict",
            "clock",
            "--stats-trace",
            &trace_s,
        ],
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    let p = &stats["processes"][0]["stats"];
    assert_eq!(p["write_prediction"]["enabled"], false, "{stats}");
    assert_eq!(p["reclaim"]["scheduler"]["mode"], "static:1", "{stats}");
    assert_eq!(p["policy"], "clock", "{stats}");
    let traces: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("trace-"))
        .collect();
    assert_eq!(traces.len(), 1, "one stats trace per process");
    let lines = std::fs::read_to_string(traces[0].path()).unwrap();
    assert!(lines.lines().count() >= 1, "the trace has samples");

    let (code, _, err, _) = run_program("12M", "mixed", "8", &["--predict-writes", "maybe"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected `on` or `off`"), "{err}");
}

/// Reclaim threads past the first open their eviction pipe only when first wanted: each holds a
/// batch's pages, which count against the user's pipe pages (64 MiB by default), and on a large
/// machine (half the CPUs' worth of reclaim threads per process) a few idle processes used to
/// take all of it. A program with little memory pressure holds one pipe (two descriptors) more
/// with reclaim threads than with none (`--reclaim direct`), whether one or four may run.
#[test]
fn idle_reclaim_threads_hold_no_eviction_pipe() {
    preload_library_is_built();
    // Counted once the pager's threads have started (the count no longer changes); the
    // listing's own descriptor is gone by the time it is read.
    let count_pipes = "import os, time\n\
        def pipes():\n\
        \x20   n = 0\n\
        \x20   for f in os.listdir('/proc/self/fd'):\n\
        \x20       try: n += os.readlink('/proc/self/fd/' + f).startswith('pipe:')\n\
        \x20       except OSError: pass\n\
        \x20   return n\n\
        last = -1\n\
        while True:\n\
        \x20   time.sleep(0.2)\n\
        \x20   n = pipes()\n\
        \x20   if n == last: break\n\
        \x20   last = n\n\
        print('pipes', n)\n";
    let pipes = |extra: &[&str]| -> usize {
        let (code, out, err, _) =
            run_with_stats("64M", extra, &[common::real_python(), "-c", count_pipes]);
        assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
        out.lines()
            .find_map(|l| l.strip_prefix("pipes "))
            .unwrap_or_else(|| panic!("no count in {out}"))
            .trim()
            .parse()
            .unwrap()
    };
    let none = pipes(&["--reclaim", "direct"]);
    let one = pipes(&["--max-reclaimers", "1"]);
    let four = pipes(&["--max-reclaimers", "4"]);
    assert_eq!(
        one,
        none + 2,
        "the first reclaim thread's pipe is open from the start: {one} against {none} without"
    );
    assert_eq!(
        four, one,
        "idle reclaim threads opened pipes: {four} against {one}"
    );
}

/// `gleaner run --trace` writes a fault trace that `gleaner trace replay` reads, holding every
/// fault the program took: the region of a program is never dropped, so the trace is written
/// out at exit (it was left empty before).
#[test]
fn a_fault_trace_under_gleaner_run_is_complete_and_replays() {
    let dir = TempDir::new("fault-trace");
    let trace = dir.path().join("faults-%p.trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let (code, out, err, stats) = run_program("8M", "mixed", "32", &["--trace", &trace_s]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let p = &stats["processes"][0];
    let path = dir.path().join(format!("faults-{}.trace", p["pid"]));
    let bytes = std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len();
    // A header, then one fixed-size record per fault.
    use gleaner_policy::trace::{HEADER_LEN, RECORD_LEN};
    let records = bytes.saturating_sub(HEADER_LEN as u64) / RECORD_LEN as u64;
    let f = &p["stats"]["faults"];
    let faults = f["zero_fill"].as_u64().unwrap() + f["remote"].as_u64().unwrap();
    assert!(
        records >= faults,
        "{records} records for {faults} zero-fill and remote faults: {stats}"
    );
    let (code, out, err) = run_gleaner(
        &[
            "trace",
            "replay",
            &path.to_string_lossy(),
            "--local",
            "50%",
            "--prefetch",
            "none",
            "--evict",
            "fifo",
            "--json",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "replay: {err}");
    let replay: serde_json::Value = serde_json::from_str(&out).expect("replay prints JSON");
    assert_eq!(replay["records"], records, "{replay}");
    assert!(
        replay["results"][0]["misses"].as_u64().unwrap() > 0,
        "{replay}"
    );
}

/// A script's helper that changes directory still finds the token file given relatively (issue
/// 14 item 5: through a pyenv shim, 5 of 15 processes could not read `tok` and ran all-local),
/// and so do the per-process paths (`--stats-trace`): the launcher makes them absolute.
#[test]
fn relative_paths_reach_processes_that_change_directory() {
    preload_library_is_built();
    let node = MemnodeProc::start("127.0.0.1:0", "256M");
    let cwd = node.dir.path().to_path_buf();
    let stats = cwd.join("stats.json");
    let mut child = Command::new(gleaner_bin())
        .current_dir(&cwd)
        .args(["run", "--local-mem", "8M", "--memnode"])
        .arg(node.endpoint.to_string())
        .args(["--token-file", "token", "--stats-trace", "trace-%p.jsonl"])
        .arg("--stats")
        .arg(&stats)
        .args(["--", "sh", "-c", "cd / && exec \"$0\" mixed 32"])
        .arg(program())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(!err.contains("could not start"), "{err}");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let procs = &stats["far_memory_processes"];
    assert_eq!(procs["stopped_pager_failed"], 0, "{stats}");
    assert_eq!(procs["all_local_fail_open"], 0, "{stats}");
    assert!(procs["started"].as_u64().unwrap() >= 1, "{stats}");
    // The program, started in `/`, really used the memnode.
    assert!(
        stats["total"]["faults"]["remote"].as_u64().unwrap() > pages(16 << 20),
        "{stats}"
    );
    let pid = stats["processes"][0]["pid"].as_u64().unwrap();
    assert!(
        cwd.join(format!("trace-{pid}.jsonl")).exists(),
        "the stats trace lands where it was asked for, not in `/`"
    );
}

/// `sh -c 'HELPER; exit 0'` where the helper's far memory cannot start: the helper is stopped
/// (exit 86), and the run fails although the script exited 0; the summary counts and names it.
#[test]
fn a_process_whose_far_memory_cannot_start_fails_the_run() {
    let (code, out, err, stats) = run_helper_with_unreadable_token(&[]);
    assert_eq!(code, Some(86), "stdout: {out}\nstderr: {err}");
    assert!(
        !out.contains("mixed ok"),
        "the helper must not have run: {out}"
    );
    assert!(out.contains("script went on"), "{out}");
    assert!(
        err.contains("1 of 2 processes could not start far memory: it was stopped (exit 86)"),
        "{err}"
    );
    assert!(
        err.contains("/nonexistent/token"),
        "the reason is named: {err}"
    );
    assert_eq!(stats["far_memory_processes"]["started"], 1, "{stats}");
    assert_one_stopped(
        &stats,
        "stopped_pager_failed",
        "failures",
        "cannot read the memnode token",
    );
}

/// The same helper under `--fail-open` runs all-local, correctly, and the run says so.
#[test]
fn fail_open_runs_the_process_all_local_and_says_so() {
    let (code, out, err, stats) = run_helper_with_unreadable_token(&["--fail-open"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "the helper ran, all-local: {out}");
    assert!(
        err.contains("runs entirely in local memory"),
        "the process warns: {err}"
    );
    assert!(
        err.contains(
            "1 of 2 processes could not start far memory: it ran entirely in local memory"
        ),
        "{err}"
    );
    let procs = &stats["far_memory_processes"];
    assert_eq!(procs["started"], 1, "{stats}");
    assert_eq!(procs["all_local_fail_open"], 1, "{stats}");
    // The helper's memory never went to the memnode (the shell, the one process on far memory,
    // writes no stats: it ends without running exit handlers).
    assert_eq!(
        stats["total"]["faults"]["remote"].as_u64().unwrap_or(0),
        0,
        "{stats}"
    );
}

/// `gleaner run [extra] -- sh -c 'GLEANER_TOKEN_FILE=/nonexistent/token PROGRAM mixed 32; echo
/// script went on'`.
fn run_helper_with_unreadable_token(
    extra: &[&str],
) -> (Option<i32>, String, String, serde_json::Value) {
    let script = format!(
        "GLEANER_TOKEN_FILE=/nonexistent/token {} mixed 32; echo script went on",
        program()
    );
    preload_library_is_built();
    let dir = TempDir::new("failopen");
    let stats = dir.path().join("stats.json");
    let stats_s = stats.to_string_lossy().into_owned();
    let mut args = vec!["run", "--local-mem", "8M", "--stats", &stats_s];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let (code, out, err) = run_gleaner(&args, LIMIT);
    let json = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null);
    (code, out, err, json)
}

/// A tenant of a shared memnode (`gleaner memnode --tenant`) whose quota is far below what the
/// program evicts: the program keeps pages local up to its allowance, then stops with exit 86
/// and a message naming the tenant, as for a full memnode; the memnode's other tenants are
/// untouched (its main token still writes).
#[test]
fn a_tenant_over_its_quota_stops_the_program_clearly() {
    preload_library_is_built();
    let dir = TempDir::new("tenant");
    let main_token = dir.path().join("main-token");
    let tenant_token = dir.path().join("small-token");
    gleaner_proto::write_token_file(&main_token, &gleaner_proto::generate_token()).unwrap();
    let spec = format!("small:{}:4M:1", tenant_token.display());
    let node = MemnodeProc::start_with_args(
        "127.0.0.1:0",
        "1G",
        TempDir::new("tenant-node"),
        main_token.clone(),
        &["--tenant", &spec],
    );
    assert!(
        tenant_token.exists(),
        "the tenant's token file was generated"
    );
    let (code, out, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &node.endpoint.to_string(),
            "--token-file",
            tenant_token.to_str().unwrap(),
            "--compress",
            "off",
            "--",
            program(),
            "mixed",
            "64",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(86), "stdout: {out}\nstderr: {err}");
    assert!(!out.contains("mixed ok"), "{out}");
    assert!(
        err.contains("tenant small"),
        "the refusal names the tenant: {err}"
    );
    // The main token still has the memnode.
    let (code, out, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "8M",
            "--memnode",
            &node.endpoint.to_string(),
            "--token-file",
            main_token.to_str().unwrap(),
            "--",
            program(),
            "mixed",
            "32",
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
}

/// A runtime prefetch hint (issue 13's application tier): the program finds `gleaner_prefetch`
/// with dlsym (no link to gleaner), hints 4 MiB of a buffer that went to the memnode, and the
/// hint thread brings those pages back before the program reads them; every byte checks out.
#[test]
fn a_prefetch_hint_brings_pages_back_before_they_are_read() {
    let (code, out, err, stats) = run_program("8M", "hint", "32", &["--prefetch", "none"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("hint ok"), "{out}");
    assert!(
        !out.contains("no gleaner_prefetch"),
        "the symbol is exported: {out}"
    );
    let h = &stats["total"]["hints"];
    // 4 MiB from a heap address: 1024 pages, or 1025 when it does not start on a page.
    let hinted = h["pages_hinted"].as_u64().unwrap();
    assert!((1024..=1025).contains(&hinted), "{stats}");
    assert!(
        h["pages_fetched"].as_u64().unwrap() > 100,
        "the hint fetched pages ahead of the reads: {stats}"
    );
}

/// A run leaves no live status file behind (`gleaner status`), though a preload-managed
/// process never drops its region: it withdraws its file at exit, and the launcher removes
/// those of processes that ended abruptly.
#[test]
fn a_run_leaves_no_status_file_behind() {
    preload_library_is_built();
    let dir = TempDir::new("status-files");
    let status_dir = dir.path().join("status");
    for mode in ["mixed", "crash"] {
        let out = Command::new(gleaner_bin())
            .args(["run", "--local-mem", "8M", "--", program(), mode, "16"])
            .env("GLEANER_STATUS_DIR", &status_dir)
            .output()
            .unwrap();
        assert!(
            mode == "crash" || out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let left: Vec<_> = std::fs::read_dir(&status_dir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{mode}: status files left: {left:?}");
    }
}

/// Big blocks freed and allocated again over and over (numpy's arrays): the heap keeps freed
/// blocks for the next ones (`--heap-retain`), so their pages come back without a discard and a
/// zero-fill, yet a calloc'd block still reads as zeros (the program checks every one) and every
/// block keeps its data, at a budget a quarter of what the program uses, with the kept blocks
/// taking as much as 12 MiB of the 16 (so that some are evicted, and come back from far). After
/// a 300 ms pause, the blocks freed before it go first when reclaim needs room.
#[test]
fn freed_big_blocks_are_reused_and_calloc_still_reads_zeros() {
    let (code, out, err, stats) = run_program("16M", "big", "64", &["--heap-retain", "12M"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("big ok"), "{out}");
    let t = &stats["total"];
    let get = |k: &str| t[k].as_u64().unwrap();
    assert!(get("reused_pages") > pages(16 << 20), "{stats}");
    // Kept blocks evicted meanwhile are discarded when taken, not fetched (their contents are
    // free): 65k of 76k pages in three runs here.
    assert!(get("reused_far_pages") > 0, "{stats}");
    assert!(
        t["reclaim"]["released_by_allocator"].as_u64().unwrap() > 0,
        "reclaim should have discarded idle kept blocks before evicting: {stats}"
    );
    // Under this pressure the data really went far and came back.
    assert!(
        t["faults"]["remote"].as_u64().unwrap() > pages(16 << 20),
        "{stats}"
    );
    eprintln!(
        "reused {} pages ({} held only far), reclaim released {}, discarded {}",
        get("reused_pages"),
        get("reused_far_pages"),
        t["reclaim"]["released_by_allocator"],
        get("discarded_pages")
    );
}

/// A program that closes every descriptor it did not open, as daemons and fork children about
/// to exec do (`close_range`, a loop of `close`, `closefrom`; in a fork child, then in the
/// parent), keeps its far memory and its data: the pager's descriptors are left open, and one
/// taken with `dup2` is refused with `EBUSY` and a warning. Low numbers stay the program's (a
/// shell's `exec 3>file`). Before the pager's descriptors were kept from the program, the
/// first such close stopped the program (exit 86: its userfaultfd or eviction pipe was gone).
#[test]
fn closing_every_descriptor_keeps_the_pagers_and_the_data() {
    let (code, out, err, stats) = run_program("16M", "close-all", "64", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let kept = number_after(&out, "kept ");
    // At least the userfaultfd, the memnode connection and an eviction pipe's two ends.
    assert!(kept >= 4, "descriptors left open: {kept}");
    assert!(
        err.contains("which gleaner holds for its far memory: refused with EBUSY"),
        "{err}"
    );
    // The data went far before the descriptors were closed, and came back after (faults and
    // prefetches: the program reads it in order).
    let t = &stats["total"];
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(48 << 20),
        "{stats}"
    );
    assert!(t["bytes_in"].as_u64().unwrap() > 48 << 20, "{stats}");
    assert_parent_holds_nothing_for_its_gone_child(&stats);
}

/// A program that locks its memory (`mlockall(MCL_CURRENT | MCL_FUTURE)`, then `mlock` on a
/// buffer) keeps its far memory and its data: the kernel locks its pages as they are touched
/// (not the whole managed reservation at once), and the pager still evicts them within the
/// budget. Its first eviction used to stop it (exit 86: the kernel refuses `MADV_DONTNEED` on
/// locked pages).
#[test]
fn a_program_that_locks_its_memory_still_pages_and_keeps_its_data() {
    let (code, out, err, stats) = run_program("16M", "mlock", "64", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(number_after(&out, "locked ") > 0, "{out}");
    assert!(
        err.contains("the program locks its memory (mlockall)"),
        "{err}"
    );
    let t = &stats["total"];
    // Written twice over a quarter-size budget: most of it went far both times.
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(96 << 20),
        "{stats}"
    );
    assert!(t["bytes_in"].as_u64().unwrap() > 48 << 20, "{stats}");
}

/// Pages a program marks `MADV_WIPEONFORK` (a mapping, half of a block, a mapping then moved
/// by `mremap`) read as zeros in a fork child and a grandchild, whether the child pages from a
/// snapshot (`--fork far`) or the parent brought its pages home (`--fork home`), and nowhere
/// else; most of them are far at the fork. BoringSSL and AWS-LC detect a fork by such a page:
/// before, the advice was accepted and ignored, and a child read the parent's data there.
#[test]
fn wipe_on_fork_pages_read_as_zeros_in_children_only() {
    for extra in [&[][..], &["--fork", "home"][..]] {
        let (code, out, err, stats) = run_program("16M", "wipe-on-fork", "64", extra);
        assert_eq!(code, Some(0), "{extra:?}: stdout: {out}\nstderr: {err}");
        assert!(out.contains("wipe-on-fork ok"), "{extra:?}: {out}");
        let t = &stats["total"];
        assert!(
            t["evictions"]["dirty"].as_u64().unwrap() > pages(48 << 20),
            "{extra:?}: {stats}"
        );
    }
}

/// Under an address-space limit (`ulimit -v`, as batch schedulers set) the far-memory heap is
/// sized to fit, and the program runs on far memory; under a limit too small for any, the
/// run fails with a message that says so and what would do. Before, every program under
/// `ulimit -v 8000000` was stopped at start (exit 86, "reserving the far arena failed: Cannot
/// allocate memory"): the reservations (192 GiB of address space, nothing committed) count
/// against the limit.
#[test]
fn an_address_space_limit_shrinks_the_far_memory_heap_to_fit() {
    let (code, out, err, stats) = run_program_under_ulimit("-v 3000000", "mixed", "64");
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("mixed ok"), "{out}");
    assert!(
        err.contains("the address-space limit (ulimit -v: "),
        "{err}"
    );
    let t = &stats["total"];
    assert!(t["faults"]["remote"].as_u64().unwrap() > 0, "{stats}");
    assert!(t["size_bytes"].as_u64().unwrap() < 1 << 30, "{stats}");

    let (code, _, err, _) = run_program_under_ulimit("-v 500000", "mixed", "64");
    assert_eq!(code, Some(86), "{err}");
    assert!(err.contains("leaves no room for far memory"), "{err}");
}

/// io_uring reads into far memory arrive: the kernel faults the buffer in through the
/// userfaultfd, as for `read(2)`.
#[test]
fn io_uring_reads_into_far_memory_arrive() {
    let (code, out, err, stats) = run_program("16M", "uring-plain", "48", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("uring-plain ok"), "{out}");
    assert!(
        stats["total"]["evictions"]["dirty"].as_u64().unwrap() > pages(32 << 20),
        "{stats}"
    );
}

/// A buffer registered with io_uring (pinned: the kernel writes into its pages directly) in far
/// memory stops the program with a message that says why and what to do, within the
/// watchdog's look (1 s). Before, the program went on, and read stale data where the kernel
/// had written (`bench/results/tried-1128/io_uring_fixed_buffer.c`).
#[test]
fn a_buffer_registered_with_io_uring_in_far_memory_stops_the_program() {
    let (code, out, err, _) = run_program("16M", "uring-fixed", "48", &[]);
    assert_eq!(code, Some(86), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("registered, read"), "{out}");
    assert!(
        err.contains("registered a buffer in far memory with io_uring (8388608 bytes at"),
        "{err}"
    );
}

/// A program started as root that drops its privileges (as `memcached -u nobody` and most
/// servers do) still reports its stats to `gleaner run`, although it can no longer create files
/// in the run's report directory; and a fork child it makes afterwards still gets far memory of
/// its own (a userfaultfd and a memnode session, which an unprivileged process could not
/// open). The program's stats used to be lost ("Permission denied": the run said no process
/// had reported any), and such a child was stopped (exit 86: "userfaultfd is not permitted").
/// The child's own report is still lost (docs/compatibility.md).
#[test]
fn a_program_that_drops_its_privileges_keeps_its_far_memory_and_its_report() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test drops privileges from root: run the suite as root, as CI does"
    );
    let (code, out, err, stats) = run_program("16M", "drop-privileges", "32", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("dropped"), "{out}");
    assert!(!err.contains("userfaultfd is not permitted"), "{err}");
    let procs = &stats["far_memory_processes"];
    assert!(procs["started"].as_u64().unwrap() >= 1, "{stats}");
    // The parent's stats, with its evictions after the drop.
    assert!(
        stats["total"]["evictions"]["dirty"].as_u64().unwrap() > pages(32 << 20),
        "{stats}"
    );
}

/// A program that gives up root stays in root's `gleaner status`: once it can no longer write
/// into root's owner-only status directory, its pager moves its file to the directory of the
/// user it became, which root's `gleaner status` reads too; and nothing is left behind in
/// either. It used to vanish from the view a few seconds after the drop (its file could no
/// longer be rewritten, and went stale).
#[test]
fn a_program_that_drops_its_privileges_stays_in_gleaner_status() {
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test drops privileges from root: run the suite as root, as CI does"
    );
    preload_library_is_built();
    let dir = TempDir::new("status-drop");
    // A scratch directory every user may create in, as /dev/shm is.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    // It prints `filled` once it has filled its memory as nobody.
    let mut child = spawned_until(
        Command::new(gleaner_bin())
            .args(["run", "--local-mem", "16M", "--"])
            .args([program(), "drop-privileges", "32"])
            .env("TMPDIR", dir.path())
            .env_remove("GLEANER_STATUS_DIR")
            .env("DROP_PRIVILEGES_LINGER_MS", "4000"),
        "filled",
    );
    let filled_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // The program, among `gleaner run`'s children (the private memnode is one too).
    let program_pid = std::fs::read_to_string(format!("/proc/{}/task/{0}/children", child.id()))
        .unwrap_or_default()
        .split_whitespace()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("gleaner_preload"))
        })
        .map(str::to_string)
        .expect("the program runs under gleaner run");
    // The status files are rewritten every second.
    std::thread::sleep(Duration::from_millis(2500));
    let status = Command::new(gleaner_bin())
        .args(["status", "--json"])
        .env("TMPDIR", dir.path())
        .env_remove("GLEANER_STATUS_DIR")
        .output()
        .unwrap();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let docs: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    // Ours is the program `gleaner run` started (other tests' programs publish beside it).
    let ours: Vec<_> = docs
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["pid"].as_u64().map(|p| p.to_string()).as_ref() == Some(&program_pid))
        .collect();
    assert_eq!(ours.len(), 1, "{docs}");
    let updated = ours[0]["updated_unix_s"].as_f64().unwrap();
    assert!(
        updated > filled_at,
        "the status was last written {:.1} s before the program, as nobody, had filled its \
         memory: {docs}",
        filled_at - updated
    );
    let system = gleaner_pager::system_dir();
    assert!(
        system.join("gleaner-status-65534").is_dir(),
        "the program published as nobody in nobody's directory"
    );
    // Nothing in the program's TMPDIR, and nothing of the program left in the status
    // directories once the run is over.
    let in_tmpdir: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        in_tmpdir.is_empty(),
        "in the program's TMPDIR: {in_tmpdir:?}"
    );
    for user in ["0", "65534"] {
        let left: Vec<_> = std::fs::read_dir(system.join(format!("gleaner-status-{user}")))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{program_pid}-")))
            .collect();
        assert!(left.is_empty(), "gleaner-status-{user}: {left:?}");
    }
}

/// A daemon: a fork child whose parent leaves at once (`memcached -d`, `redis-server
/// --daemonize yes`). Once its parent is gone it takes over the parent's budget: under
/// `--local-mem 32M` it keeps 24 MiB resident, where it used to page within a quarter of it
/// (8 MiB) for the rest of its life. Given `--fork-local-mem`, it keeps that budget. Either
/// way its data, and what it inherited from its parent, is intact.
/// `gleaner run --local-mem 32M EXTRA.. -- preload_program daemon MB OUT DAEMON_ARGS..`; once
/// the run has returned (status 0) and the daemon has written its report (within a minute),
/// which must say `ok`: `gleaner run`'s stderr and the report.
fn run_daemon(extra: &[&str], mb: &str, daemon_args: &[&str]) -> (String, String) {
    preload_library_is_built();
    let dir = TempDir::new("daemon");
    let out = dir.path().join("daemon.out");
    let out_s = out.to_string_lossy().into_owned();
    let mut args = vec!["run", "--local-mem", "32M"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", program(), "daemon", mb, &out_s]);
    args.extend_from_slice(daemon_args);
    let (code, stdout, stderr) = run_gleaner(&args, LIMIT);
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !out.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon never reported (its far memory failed?)\n{stderr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = std::fs::read_to_string(&out).unwrap();
    assert!(report.contains("\nok"), "{args:?}: {report}");
    (stderr, report)
}

#[test]
fn a_daemon_takes_over_the_budget_of_the_process_that_forked_it() {
    let daemon_rss_kb =
        |extra: &[&str]| u64::from(number_after(&run_daemon(extra, "24", &[]).1, "rss "));
    let inherited = daemon_rss_kb(&[]);
    let kept = daemon_rss_kb(&["--fork-local-mem", "8M"]);
    eprintln!("daemon's resident memory: {inherited} kB inheriting, {kept} kB at 8M");
    // 27 MB here, against 11 MB on a quarter of the budget. The watchdog that raises the
    // budget runs at the idle class and may be late on a busy machine, but the daemon's last
    // pass reads all its data back: what went far before comes back and stays.
    assert!(
        inherited > 18 << 10,
        "the daemon kept most of its 24 MiB resident under its parent's 32 MiB budget: \
         {inherited} kB"
    );
    assert!(
        kept < 16 << 10,
        "the daemon given --fork-local-mem 8M kept to it: {kept} kB"
    );
}

/// A daemon that moved its environment into its heap and wrote over the original, as
/// `setproctitle` does (redis, nginx): `gleaner run` still sees it as one of its processes
/// (it holds the run's report files open), so the private memnode stays for it, and it pages
/// 48 MiB through a 32 MiB budget and finds every byte. `gleaner run` used to look only at
/// `/proc/PID/environ`, which no longer named the run: it stopped the memnode with the
/// program, and the daemon's first write-back failed.
#[test]
fn a_daemon_that_rewrites_its_environment_keeps_its_far_memory() {
    let (stderr, _) = run_daemon(&[], "48", &["title"]);
    assert!(
        stderr.contains("processes it started still run"),
        "{stderr}"
    );
}

/// A program whose environment lives in its (managed) heap, as after `setproctitle`, whose
/// memnode dies: it is stopped with exit 86 and the message. The pager thread that finds the
/// loss reports it to `gleaner run`, and used to read `$GLEANER_REPORT_DIR` from the
/// environment then: the environment's page was far, only that thread's fellows could serve
/// it, and the program hung for good instead of stopping.
#[test]
fn a_program_whose_environment_went_far_is_stopped_when_its_memnode_dies() {
    preload_library_is_built();
    let mut node = MemnodeProc::start_short_lease("127.0.0.1:0", "1G");
    use std::os::unix::process::CommandExt;
    let mut child = spawned_until(
        Command::new(gleaner_bin())
            .args(["run", "--local-mem", "8M", "--memnode"])
            .arg(node.endpoint.to_string())
            .arg("--token-file")
            .arg(&node.token_file)
            .args(["--", program(), "env-far", "64"])
            .stdin(Stdio::null())
            .process_group(0),
        "filled",
    );
    std::thread::sleep(Duration::from_millis(500));
    node.kill();
    // A group of its own: a hung program, which would hold its output open, goes with
    // `gleaner run` when the wait runs out, and the test fails instead of hanging.
    let (code, out, err) = wait_output(&mut child, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(gleaner_pager::FATAL_EXIT_CODE),
        "stdout: {out}\nstderr: {err}"
    );
    assert!(err.contains("gleaner: FATAL"), "{err}");
}

/// A program that holds every descriptor its limit allows (as a busy server may, handling
/// `EMFILE` itself) still gets its far memory: the pager keeps spare descriptors for what it
/// makes mid-run (an evictor's pipe for a thread that reclaims late, a shared-memory grant's
/// memfd), and the slabs' memfds are closed once mapped. It used to be stopped (exit 86) at its
/// first grant or late evictor ("Too many open files").
#[test]
fn a_program_at_its_descriptor_limit_keeps_its_far_memory() {
    let (code, out, err, stats) = run_program_under_ulimit("-n 256", "fd-limit", "128");
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let opened = number_after(&out, "opened ");
    assert!(
        opened > 150,
        "the program held most of its 256 descriptors: {opened}"
    );
    assert_paged_128_mib_through_grants(&stats);
}

/// A 128 MiB program under a 16 MiB budget paged through the shared-memory store: two grants
/// or more, and more than 112 MiB written back.
fn assert_paged_128_mib_through_grants(stats: &serde_json::Value) {
    let t = &stats["total"];
    assert!(
        t["store"]["slabs"].as_u64().unwrap() >= 2,
        "grants at the limit: {stats}"
    );
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(112 << 20),
        "{stats}"
    );
}

/// A program with a thread that takes every free descriptor, over and over, while its memory
/// goes far and comes back: each of the pager's new descriptors (a grant's socket clone and
/// memfd, an evictor's pipe) races with the program for the last numbers, and must still be
/// made, with the data intact. (A grant once held its room over the memnode's round trip, and
/// such a program took every number the raised limit gave: the grant arrived with no
/// descriptor and the program was stopped.)
#[test]
fn a_program_racing_for_every_descriptor_keeps_its_far_memory() {
    let (code, out, err, stats) = run_program_under_ulimit("-n 256", "fd-churn", "128");
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("fd-churn ok"), "{out}");
    assert!(
        number_after(&out, "limits ") > 10,
        "the thread reached the limit again and again: {out}"
    );
    assert_paged_128_mib_through_grants(&stats);
}

/// With `--heap-retain 0` every freed big block is discarded at once (the behaviour before
/// blocks were kept): nothing is reused, and the program's data is the same.
#[test]
fn heap_retain_zero_discards_every_freed_big_block() {
    let (code, out, err, stats) = run_program("16M", "big", "64", &["--heap-retain", "0"]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("big ok"), "{out}");
    let t = &stats["total"];
    assert_eq!(t["reused_pages"], 0, "{stats}");
    assert_eq!(t["reclaim"]["released_by_allocator"], 0, "{stats}");
    assert!(
        t["discarded_pages"].as_u64().unwrap() > pages(64 << 20),
        "{stats}"
    );
}

/// The CPUs each of the program's `gleaner-*` threads may run on, as `name=list` lines, from a
/// real Python program pinned to CPU 0 under `gleaner run` with `extra` flags.
fn pager_thread_cpus(extra: &[&str]) -> String {
    let script = "import os\n\
        x = [bytearray(4096) for _ in range(20000)]\n\
        for t in os.listdir('/proc/self/task'):\n\
        \x20   name = open(f'/proc/self/task/{t}/comm').read().strip()\n\
        \x20   if name.startswith('gleaner'):\n\
        \x20       cpus = [l.split()[1] for l in open(f'/proc/self/task/{t}/status') if l.startswith('Cpus_allowed_list')]\n\
        \x20       print(f'{name}={cpus[0]}')\n";
    let mut args = vec!["run", "-q", "--local-mem", "16M"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--",
        "taskset",
        "-c",
        "0",
        common::real_python(),
        "-c",
        script,
    ]);
    let (code, out, err) = common::run_gleaner(&args, Duration::from_secs(120));
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    out
}

#[test]
fn reclaim_threads_run_on_every_cpu_unless_told_to_keep_to_the_programs() {
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if online < 2 {
        eprintln!("SKIPPED LOUDLY: one CPU online, so `any` and `program` are the same set here");
        return;
    }
    let any = pager_thread_cpus(&[]);
    assert!(any.contains("gleaner-recl0="), "{any}");
    for line in any.lines() {
        let (name, cpus) = line.split_once('=').unwrap();
        if name.starts_with("gleaner-recl") {
            // Every online CPU (the default): more than the program's one.
            assert_ne!(cpus, "0", "{any}");
            assert!(cpus.starts_with("0-") || cpus.contains(','), "{any}");
        } else {
            // The handlers and the other threads keep to the program's CPU.
            assert_eq!(cpus, "0", "{any}");
        }
    }
    let kept = pager_thread_cpus(&["--reclaim-cpus", "program"]);
    assert!(kept.contains("gleaner-recl0=0"), "{kept}");
    assert!(kept.lines().all(|l| l.ends_with("=0")), "{kept}");
    let (code, _, err) = common::run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--reclaim-cpus",
            "all",
            "--",
            "true",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a choice of CPUs for reclaim"), "{err}");
}

/// The pager's periodic threads (the live status, here) sleep through eviction batches: they
/// wake for their period or the end, not at every batch. The status thread slept on the
/// batches' progress signal until 2026-11-28 and woke about 260 times a second on a pinned
/// program's CPU in memcached's harness cell; under the program below, touching random pages
/// of 96 MiB at a 32 MiB budget for 2 seconds, it woke 1582 times (1595 batches).
#[test]
fn the_status_thread_sleeps_through_eviction_batches() {
    let script = "import os, random, time\n\
        b = bytearray(96 << 20)\n\
        n = len(b) // 4096\n\
        r = random.Random(1)\n\
        t = time.time()\n\
        while time.time() - t < 2:\n\
        \x20   for _ in range(20000):\n\
        \x20       i = r.randrange(n) * 4096\n\
        \x20       b[i] = (b[i] + 1) & 255\n\
        for t in os.listdir('/proc/self/task'):\n\
        \x20   name = open(f'/proc/self/task/{t}/comm').read().strip()\n\
        \x20   if name == 'gleaner-status':\n\
        \x20       v = [l.split()[1] for l in open(f'/proc/self/task/{t}/status') if l.startswith('voluntary_ctxt_switches')]\n\
        \x20       print(f'status-wakeups={v[0]}')\n";
    let (code, out, err, s) =
        run_with_stats("32M", &["-q"], &[common::real_python(), "-c", script]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let wakeups: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("status-wakeups="))
        .unwrap_or_else(|| panic!("no status thread seen: {out}"))
        .trim()
        .parse()
        .unwrap();
    let batches = s["total"]["evictions"]["batches"].as_u64().unwrap();
    // Evictions kept going the whole time; the status thread's period is a second (its first
    // look after 200 ms), so a handful of wake-ups, not one per batch.
    assert!(batches > 200, "too few eviction batches to tell: {batches}");
    assert!(
        wakeups < 20,
        "the status thread woke {wakeups} times in a 2 s run of {batches} eviction batches"
    );
}

/// A program that closes one of its own descriptors, then puts a saved copy back on the number
/// with `dup2`, over and over (what CPython's `subprocess` tests do to a standard stream), while
/// the pager makes descriptors of its own (its watchdog reads `/proc` every second, the status
/// file is rewritten, faults fetch): the number is always the program's. A descriptor the pager
/// had just made sat at the free number, unrecorded, and the program's `dup2` replaced it or its
/// second `close` closed it: the pager then closed the program's restored file (CPython exited
/// with status 1, silently) or aborted ("unexpected error during closedir"); the C program
/// failed within seconds, 3 runs of 3, before the pager's windows (`gleaner_fds::making`).
#[test]
fn a_program_swapping_its_descriptors_never_meets_the_pagers() {
    let (code, out, err, stats) = run_program("16M", "swap-fds", "64", &[]);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(number_after(&out, "swaps ") > 1000, "{out}");
    let t = &stats["total"];
    assert!(t["faults"]["remote"].as_u64().unwrap() > 0, "{stats}");
    assert!(
        t["evictions"]["dirty"].as_u64().unwrap() > pages(48 << 20),
        "{stats}"
    );
}

/// A panic in gleaner's code names itself through `gleaner run`, whatever the program did to its
/// descriptor 2 (here: /dev/null before the program starts), and fails the run. Before, such a
/// panic printed only to the program's stderr: a CPython test that had swapped it for a
/// temporary file aborted without a word.
#[test]
fn a_panic_in_gleaner_names_itself_though_the_program_hid_its_stderr() {
    use std::os::unix::process::CommandExt;
    preload_library_is_built();
    let script = format!("exec 2>/dev/null; exec {} mixed 64", program());
    let name = std::path::Path::new(program())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut child = Command::new(common::gleaner_bin())
        .process_group(0)
        .args(["run", "--local-mem", "16M", "--", "sh", "-c", &script])
        .env("GLEANER_TEST_PANIC", &name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, err) = wait_output(&mut child, LIMIT);
    assert_ne!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        err.contains(&format!(
            "1 process was aborted (SIGABRT) by a panic in gleaner's code, a gleaner bug \
             (please report it with this message); first: {name} (pid "
        )),
        "{err}"
    );
    assert!(
        err.contains("thread 'gleaner-test-panic' panicked at")
            && err.contains("a test panic (GLEANER_TEST_PANIC)"),
        "{err}"
    );
}
