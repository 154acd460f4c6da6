//! `gleaner trace synth` and `gleaner trace replay` through the clap interface.

use std::process::ExitCode;

use clap::Parser;
use gleaner_policy::cli::{self, TraceCommand, TraceSubcommand};

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    cmd: TraceCommand,
}

fn parse(args: &[&str]) -> TraceCommand {
    let mut all = vec!["trace"];
    all.extend_from_slice(args);
    Wrapper::try_parse_from(all).unwrap().cmd
}

#[test]
fn synth_then_replay() {
    let dir = std::env::temp_dir().join(format!("gleaner-policy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("seq.trace");
    let f = file.to_str().unwrap();
    let synth = parse(&[
        "synth",
        "--pattern",
        "stride:10",
        "--pages",
        "500",
        "--accesses",
        "5000",
        "--out",
        f,
    ]);
    assert_eq!(cli::main(synth), ExitCode::SUCCESS);
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        32 + 5000 * 24,
        "header + records"
    );
    let replay = parse(&["replay", f, "--local", "50%", "--json"]);
    match &replay.command {
        TraceSubcommand::Replay(a) => {
            assert_eq!(a.prefetch, "all");
            assert_eq!(a.visibility, "both");
        }
        TraceSubcommand::Synth(_) => panic!("parsed as synth"),
    }
    assert_eq!(cli::main(replay), ExitCode::SUCCESS);
    let some = parse(&[
        "replay",
        f,
        "--local",
        "1M",
        "--prefetch",
        "leap,next:2",
        "--evict",
        "lru,belady",
    ]);
    assert_eq!(cli::main(some), ExitCode::SUCCESS);
    // Errors: a bad list, a missing file, a corrupt file.
    let bad = parse(&["replay", f, "--local", "100", "--prefetch", "psychic"]);
    assert_eq!(cli::main(bad), ExitCode::FAILURE);
    let missing = parse(&["replay", "/nonexistent/x.trace", "--local", "100"]);
    assert_eq!(cli::main(missing), ExitCode::FAILURE);
    std::fs::write(&file, b"not a trace at all, clearly").unwrap();
    let corrupt = parse(&["replay", f, "--local", "100"]);
    assert_eq!(cli::main(corrupt), ExitCode::FAILURE);
    let bad_pattern = parse(&[
        "synth",
        "--pattern",
        "spiral",
        "--pages",
        "5",
        "--accesses",
        "5",
        "--out",
        f,
    ]);
    assert_eq!(cli::main(bad_pattern), ExitCode::FAILURE);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn table_has_a_row_per_combination() {
    use gleaner_policy::evict::{EvictKind, Visibility};
    use gleaner_policy::prefetch::PrefetcherKind;
    use gleaner_policy::sim::{self, SimConfig};
    use gleaner_policy::trace::synth::{generate, Pattern, SynthConfig};
    let t = generate(&SynthConfig::new(Pattern::Zipf(0.99), 1_000, 5_000));
    let combos = sim::combos(
        &PrefetcherKind::all(),
        &EvictKind::all(),
        &[Visibility::Fault, Visibility::Oracle],
    );
    // 14 eviction rows per prefetcher: fifo, clock x2, refault, rackmem x2, recency x2,
    // active x2, frequency x2, lru, belady.
    assert_eq!(combos.len(), 5 * 14);
    let cfg = SimConfig::new(300);
    let rows = sim::run_all(&t, &cfg, &combos, 4);
    let table = cli::format_table(std::path::Path::new("z"), t.len(), 1_000, &cfg, &rows);
    assert_eq!(table.lines().count(), 2 + 70, "{table}");
    assert!(
        table.contains("rackmem")
            && table.contains("recency")
            && table.contains("active")
            && table.contains("frequency")
            && table.contains("belady")
    );
    // Every LRU row is 1.000 times itself.
    assert!(table
        .lines()
        .filter(|l| l.contains(" lru "))
        .all(|l| l.contains("1.000")));
}
