//! The `gleaner memnode` command line: serve (the default), or `stats` to query a running memnode.
//!
//! ```text
//! gleaner memnode [--listen ADDR] [--capacity SIZE] [--token-file F] [--lease SECS] [--exit-on-stdin-eof]
//! gleaner memnode stats [--addr ADDR] [--token-file F]
//! ```
//!
//! When serving, exactly one line goes to stdout once the socket is bound:
//! `listening on <ENDPOINT>` (the real port when port 0 was asked for, `unix:/path` for Unix
//! sockets). Launchers parse it; everything else is logged to stderr through the `log` crate.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use clap::{Args, Subcommand};
use gleaner_proto::units::{default_token_path, format_size, parse_size};
use gleaner_proto::{
    generate_token, read_token_file, write_token_file, ClientError, ConnectOptions, Connection,
    Endpoint, Token, PAGE_SIZE,
};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{Server, ServerConfig, ServerError, StatsSnapshot, TenantConfig};

/// Default listening address of `gleaner memnode` and default target of `gleaner memnode stats`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7070";

/// Run a memory node (pages for far-memory clients), or query one with `memnode stats`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MemnodeCommand {
    /// Query a running memnode instead of serving.
    #[command(subcommand)]
    pub command: Option<MemnodeSubcommand>,
    /// Options for serving (used when no subcommand is given).
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands of `gleaner memnode`.
#[derive(Subcommand, Debug)]
pub enum MemnodeSubcommand {
    /// Print a running memnode's stats as pretty-printed JSON.
    Stats(StatsArgs),
    /// Drain a running memnode before taking it down: clients using it in a pool of memnodes
    /// copy their pages to the other memnodes and leave; it exits once no session is left
    /// (clients with no other memnode stay until they end). Waits for that, printing progress.
    Drain(DrainArgs),
}

/// Options of `gleaner memnode drain`.
#[derive(Args, Debug)]
pub struct DrainArgs {
    /// The memnode to drain: HOST:PORT or unix:PATH (`--memnode` as in `gleaner run`).
    #[arg(long, visible_alias = "memnode", value_name = "ADDR", default_value = DEFAULT_ADDR)]
    pub addr: Endpoint,
    /// The shared token [default: $GLEANER_TOKEN_FILE, else ~/.gleaner/token].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Give up waiting (exit 1; the memnode keeps draining) after this many seconds.
    #[arg(long, value_name = "SECS", default_value = "600")]
    pub timeout: u64,
}

/// Options of `gleaner memnode` (serving).
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where to listen: HOST:PORT (port 0 picks a free port) or unix:PATH.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_ADDR)]
    pub listen: Endpoint,
    /// Total memory for pages, e.g. 512M or 4G, at least one page (4096 bytes); stored pages
    /// count the bytes the client sent (less when it compresses them) [default: half of
    /// MemAvailable].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub capacity: Option<u64>,
    /// The shared token; generated (mode 0600) if missing [default: $GLEANER_TOKEN_FILE, else
    /// ~/.gleaner/token].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Seconds a session outlives its last connection (for re-attach) before its pages are freed.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_lease)]
    pub lease: Duration,
    /// Shut down when standard input reaches end of file (for launchers holding the pipe). A
    /// line `linger` before the end asks it to serve on until no session is left (their
    /// clients gone and their leases out), for a launcher that leaves while a client it
    /// started (a daemon) still runs.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// A directory made for this memnode alone (its Unix socket, its token file): when it
    /// exits, the token file in it and then the directory, if empty, are removed (for
    /// launchers; nothing else in it is touched).
    #[arg(long, value_name = "DIR", hide = true)]
    pub private_dir: Option<PathBuf>,
    /// A tenant, NAME:TOKEN_FILE:QUOTA:WEIGHT (repeatable): clients holding its token (the file
    /// is generated, mode 0600, if missing) share a quota of QUOTA bytes (e.g. 2G) and never
    /// see other tenants' sessions; WEIGHT (a positive integer) is its share under contention.
    /// The --token-file token stays valid, with the whole capacity.
    #[arg(long, value_name = "SPEC", value_parser = parse_tenant)]
    pub tenant: Vec<TenantSpec>,
    /// Serve page data at most at RATE bytes per second (e.g. 100M) in each direction, an
    /// emulated full-duplex link shared by all clients (reads out, write-backs in): requests
    /// waiting for it are served in fair order by tenant weight, and `gleaner memnode stats`
    /// shows each tenant's queue wait. Default: no limit.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bandwidth: Option<u64>,
    /// With --bandwidth: how waiting requests take the link, `fair` (by tenant weight; within
    /// a client, demand reads before prefetches; prefetches past their deadline dropped) or
    /// `fifo` (first come first served, the baseline).
    #[arg(long, value_name = "fair|fifo", default_value = "fair")]
    pub schedule: crate::config::Schedule,
    /// Serve Prometheus metrics over HTTP at http://ADDR/metrics (HOST:PORT, e.g.
    /// 127.0.0.1:9470; port 0 picks a free one, logged): capacity, bytes used, sessions,
    /// per-tenant bytes and queue waits, bytes in and out, errors by kind, session attaches.
    /// They cover the whole memnode, every tenant included: bind it where only operators reach.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// Parses `--bandwidth`: a size per second, above zero.
fn parse_rate(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("the bandwidth must be above zero".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e} (bytes per second, e.g. 100M)")),
    }
}

/// A `--tenant` as given.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    /// Its name.
    pub name: String,
    /// Its token file.
    pub token_file: PathBuf,
    /// Its quota in bytes.
    pub quota: u64,
    /// Its weight.
    pub weight: u32,
}

/// Parses NAME:TOKEN_FILE:QUOTA:WEIGHT (the token file may itself contain colons).
fn parse_tenant(s: &str) -> Result<TenantSpec, String> {
    let bad = || format!("`{s}` is not NAME:TOKEN_FILE:QUOTA:WEIGHT");
    let (name, rest) = s.split_once(':').ok_or_else(bad)?;
    let (rest, weight) = rest.rsplit_once(':').ok_or_else(bad)?;
    let (token_file, quota) = rest.rsplit_once(':').ok_or_else(bad)?;
    if name.is_empty() || token_file.is_empty() {
        return Err(bad());
    }
    let quota = parse_size(quota).map_err(|e| format!("tenant {name}: quota: {e}"))?;
    let weight: u32 = weight
        .parse()
        .ok()
        .filter(|&w| w > 0)
        .ok_or_else(|| format!("tenant {name}: the weight must be a positive integer"))?;
    Ok(TenantSpec {
        name: name.to_string(),
        token_file: PathBuf::from(token_file),
        quota,
        weight,
    })
}

/// Options of `gleaner memnode stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The memnode to query: HOST:PORT or unix:PATH (`--memnode` as in `gleaner run`).
    #[arg(long, visible_alias = "memnode", value_name = "ADDR", default_value = DEFAULT_ADDR)]
    pub addr: Endpoint,
    /// The shared token [default: $GLEANER_TOKEN_FILE, else ~/.gleaner/token].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// Why a `gleaner memnode` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The token file exists but cannot be used (unreadable, too permissive, malformed).
    #[error("cannot use token file {}: {source}", path.display())]
    TokenRead {
        /// The token file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// A new token file could not be created.
    #[error("cannot create token file {}: {source}", path.display())]
    TokenCreate {
        /// The token file.
        path: PathBuf,
        /// What went wrong.
        source: io::Error,
    },
    /// The capacity cannot be determined or is too small.
    #[error("{0}")]
    Capacity(String),
    /// Signal handlers could not be installed.
    #[error("cannot install SIGTERM/SIGINT handlers: {0}")]
    Signals(io::Error),
    /// The server failed to start or run.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// Talking to a memnode failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `stats` could not get its token.
    #[error("cannot query memnode at {addr}: {source}")]
    StatsToken {
        /// The memnode asked.
        addr: Endpoint,
        /// The token error.
        source: Box<CliError>,
    },
    /// The memnode's stats reply is not JSON.
    #[error("memnode at {addr} sent stats that are not valid JSON: {source}")]
    BadStats {
        /// The memnode asked.
        addr: Endpoint,
        /// The parse error.
        source: serde_json::Error,
    },
    /// `drain` gave up waiting.
    #[error("{0}")]
    DrainTimeout(String),
    /// Writing to stdout failed.
    #[error("cannot write to stdout: {0}")]
    Stdout(io::Error),
    /// The metrics endpoint could not start.
    #[error("{0}")]
    Metrics(io::Error),
}

/// Runs `gleaner memnode ...`; errors are printed to stderr and give a non-zero exit status.
pub fn main(cmd: MemnodeCommand) -> ExitCode {
    let result = match cmd.command {
        Some(MemnodeSubcommand::Stats(args)) => stats(args),
        Some(MemnodeSubcommand::Drain(args)) => drain(args),
        None => serve(cmd.serve),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gleaner memnode: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until SIGTERM, SIGINT or (with `--exit-on-stdin-eof`) the end of stdin.
fn serve(args: ServeArgs) -> Result<(), CliError> {
    let token_path = args.token_file.clone().unwrap_or_else(default_token_path);
    let token = load_or_create_token(&token_path)?;
    let capacity_bytes = match args.capacity {
        Some(b) => b,
        None => {
            let avail = mem_available().map_err(|e| {
                CliError::Capacity(format!(
                    "cannot read MemAvailable from /proc/meminfo ({e}); pass --capacity"
                ))
            })?;
            log::info!(
                "no --capacity given: using half of MemAvailable ({})",
                format_size(avail)
            );
            avail / 2
        }
    };
    if capacity_bytes < PAGE_SIZE as u64 {
        return Err(CliError::Capacity(format!(
            "capacity of {capacity_bytes} bytes is less than one {PAGE_SIZE}-byte page"
        )));
    }
    // Registered before binding, so a signal that arrives early is queued, not fatal.
    let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(CliError::Signals)?;
    let mut config = ServerConfig::new(args.listen.clone(), capacity_bytes, token);
    config.lease = args.lease;
    config.bandwidth_bytes_per_s = args.bandwidth;
    config.schedule = args.schedule;
    for t in &args.tenant {
        config.tenants.push(TenantConfig {
            name: t.name.clone(),
            token: load_or_create_token(&t.token_file)?,
            quota_bytes: t.quota,
            weight: t.weight,
        });
    }
    let server = Server::bind(config)?;
    if args.private_dir.is_some() {
        open_socket_to_dropped_privileges(server.local_endpoint());
    }
    log::info!(
        "memnode: capacity {} ({capacity_bytes} bytes), lease {:?}, token file {}",
        format_size(capacity_bytes),
        args.lease,
        token_path.display()
    );
    // Before the `listening on` line: a bad --metrics address fails the start, and a launcher
    // never sees a memnode that then exits.
    let metrics = match &args.metrics {
        Some(addr) => {
            let handle = server.shutdown_handle();
            let m = gleaner_metrics::serve(addr, "memnode-metrics", move || {
                crate::metrics::render(&handle.stats())
            })
            .map_err(CliError::Metrics)?;
            log::info!("metrics at http://{}/metrics", m.local_addr());
            Some(m)
        }
        None => None,
    };
    {
        let mut out = io::stdout().lock();
        writeln!(out, "listening on {}", server.local_endpoint())
            .and_then(|()| out.flush())
            .map_err(CliError::Stdout)?;
    }
    let signal_handle = signals.handle();
    let stop = server.shutdown_handle();
    let signal_thread = thread::Builder::new()
        .name("memnode-signals".into())
        .spawn(move || {
            let mut seen = 0;
            for sig in signals.forever() {
                seen += 1;
                let name = if sig == SIGTERM { "SIGTERM" } else { "SIGINT" };
                if seen > 1 {
                    log::warn!("received {name} again during shutdown; exiting now");
                    std::process::exit(1);
                }
                log::info!("received {name}; shutting down");
                stop.shutdown();
            }
        })
        .map_err(CliError::Signals)?;
    if args.exit_on_stdin_eof {
        let stop = server.shutdown_handle();
        // Not joined: it may stay blocked on stdin after a signal-initiated shutdown, and the
        // process exits right after anyway.
        thread::Builder::new()
            .name("memnode-stdin".into())
            .spawn(move || {
                if wait_for_stdin_eof() {
                    log::info!("stdin closed; serving until no session is left");
                    // The launcher is gone or going: its output must not wait for this
                    // process (a shell's `$(...)`, a pipe), so ours goes nowhere from here.
                    detach_output();
                    while !stop.is_shutting_down() {
                        let s = stop.stats();
                        if s.sessions_total == 0 && s.live_connections == 0 {
                            break;
                        }
                        thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
                log::info!("stdin closed; shutting down");
                stop.shutdown();
            })
            .map_err(|e| {
                CliError::Server(ServerError::Thread {
                    name: "memnode-stdin".into(),
                    source: e,
                })
            })?;
    }
    let result = server.run();
    if let Some(m) = metrics {
        m.stop();
    }
    signal_handle.close();
    let _ = signal_thread.join();
    if let Some(dir) = &args.private_dir {
        // The socket file is gone already (`Server::run`).
        if token_path.starts_with(dir) {
            let _ = fs::remove_file(&token_path);
        }
        let _ = fs::remove_dir(dir);
    }
    let summary = result?;
    log::info!("{summary}");
    Ok(())
}

/// A launcher's private memnode run as root: its Unix socket is made connectable by any user, so
/// that a program that drops its privileges (`setuid`) and then forks can open its child's
/// session (the launcher's directory lets others pass through, not list). Every session still
/// needs the token, whose file stays the launcher's alone.
fn open_socket_to_dropped_privileges(endpoint: &Endpoint) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Endpoint::Unix(path) = endpoint {
        if let Err(e) = fs::set_permissions(path, fs::Permissions::from_mode(0o666)) {
            log::warn!("making {} connectable: {e}", path.display());
        }
    }
}

/// The token (from `token_file`, default `~/.gleaner/token`) and connection options with which
/// `gleaner memnode WHAT` talks to the memnode at `addr`.
fn client_of(
    addr: &Endpoint,
    token_file: Option<&PathBuf>,
    what: &str,
) -> Result<(Token, ConnectOptions), CliError> {
    let token_path = token_file.cloned().unwrap_or_else(default_token_path);
    let token = read_token_file(&token_path).map_err(|source| CliError::StatsToken {
        addr: addr.clone(),
        source: Box::new(CliError::TokenRead {
            path: token_path.clone(),
            source,
        }),
    })?;
    let opts = ConnectOptions {
        reply_timeout: Duration::from_secs(10),
        client_name: format!("gleaner memnode {what} (pid {})", std::process::id()),
        ..ConnectOptions::default()
    };
    Ok((token, opts))
}

/// Starts draining a memnode, then waits until it has stopped (nothing listens any more),
/// printing its sessions and bytes whenever they change.
fn drain(args: DrainArgs) -> Result<(), CliError> {
    let (token, opts) = client_of(&args.addr, args.token_file.as_ref(), "drain")?;
    let mut conn = Connection::connect(&args.addr, &token, None, &opts)?;
    let sessions = conn.drain()?;
    let _ = conn.goodbye();
    println!(
        "memnode at {} is draining: {} other session(s) to leave",
        args.addr,
        sessions.saturating_sub(1)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(args.timeout);
    let mut last = String::new();
    loop {
        let state = match Connection::connect(&args.addr, &token, None, &opts) {
            Ok(mut c) => {
                let json = c.stats()?;
                let _ = c.goodbye();
                let v: serde_json::Value =
                    serde_json::from_str(&json).map_err(|source| CliError::BadStats {
                        addr: args.addr.clone(),
                        source,
                    })?;
                // This query's own session is counted too.
                let others = v["sessions_total"].as_u64().unwrap_or(0).saturating_sub(1);
                format!(
                    "{others} session(s) left, {} held",
                    format_size(v["used_bytes"].as_u64().unwrap_or(0))
                )
            }
            // Nothing listens (or the socket file is gone), or it hung up mid-query: stopped.
            Err(ClientError::Connect { .. } | ClientError::Transport { .. }) => {
                println!("memnode at {} drained and stopped", args.addr);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        if state != last {
            println!("{state}");
            last = state;
        }
        if std::time::Instant::now() > deadline {
            return Err(CliError::DrainTimeout(format!(
                "memnode at {} is still draining after {} s ({last}); it goes on draining",
                args.addr, args.timeout
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Prints a running memnode's stats as pretty JSON.
fn stats(args: StatsArgs) -> Result<(), CliError> {
    let (token, opts) = client_of(&args.addr, args.token_file.as_ref(), "stats")?;
    let mut conn = Connection::connect(&args.addr, &token, None, &opts)?;
    let json = conn.stats()?;
    if let Err(e) = conn.goodbye() {
        log::warn!("ending the stats session failed: {e}");
    }
    let bad = |source| CliError::BadStats {
        addr: args.addr.clone(),
        source,
    };
    // Through the typed document when it matches, to keep its field order; as a plain JSON
    // value otherwise (a memnode of another version).
    let pretty = match serde_json::from_str::<StatsSnapshot>(&json) {
        Ok(typed) => serde_json::to_string_pretty(&typed),
        Err(_) => serde_json::from_str::<serde_json::Value>(&json)
            .map_err(bad)
            .map(|v| serde_json::to_string_pretty(&v))?,
    }
    .map_err(bad)?;
    let mut out = io::stdout().lock();
    writeln!(out, "{pretty}")
        .and_then(|()| out.flush())
        .map_err(CliError::Stdout)
}

/// Reads the token at `path`, or creates one there (mode 0600, parent directory 0700) if the
/// file does not exist. Creation is atomic: a concurrent memnode creating the same file ends up
/// with the same token.
pub fn load_or_create_token(path: &Path) -> Result<Token, CliError> {
    let read = |path: &Path| {
        read_token_file(path).map_err(|source| CliError::TokenRead {
            path: path.to_path_buf(),
            source,
        })
    };
    match fs::metadata(path) {
        Ok(_) => return read(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(CliError::TokenRead {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    let create_err = |source| CliError::TokenCreate {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(create_err)?;
    }
    // Write a private temporary file, then hard-link it into place: the link fails if someone
    // else created the token meanwhile, and nobody ever reads a half-written token.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let token = generate_token();
    write_token_file(&tmp, &token).map_err(create_err)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            log::info!(
                "generated a new token in {} (mode 0600); clients need this file",
                path.display()
            );
            Ok(token)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(path),
        Err(e) => Err(create_err(e)),
    }
}

/// Blocks until standard input reaches end of file (or fails).
/// Points standard output and error at `/dev/null`.
fn detach_output() {
    if let Ok(null) = fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        for fd in [1, 2] {
            // SAFETY: dup2 onto the standard descriptors from an open file; no memory is
            // passed.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Waits for the end of stdin; returns whether a line `linger` came before it.
fn wait_for_stdin_eof() -> bool {
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 512];
    let mut seen = Vec::new();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => return seen.split(|&b| b == b'\n').any(|l| l == b"linger"),
            Ok(n) if seen.len() < 4096 => seen.extend_from_slice(&buf[..n]),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("reading stdin failed ({e}); treating it as closed");
                return false;
            }
        }
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn mem_available() -> io::Result<u64> {
    let text = fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no MemAvailable line"))
}

/// Parses `--lease`: seconds, fractions allowed.
fn parse_lease(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is not a valid lease"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct Top {
        #[command(subcommand)]
        cmd: TopCmd,
    }

    #[derive(Subcommand, Debug)]
    enum TopCmd {
        Memnode(MemnodeCommand),
    }

    fn parse(args: &[&str]) -> Result<MemnodeCommand, clap::Error> {
        let mut v = vec!["gleaner", "memnode"];
        v.extend_from_slice(args);
        Top::try_parse_from(v).map(|t| match t.cmd {
            TopCmd::Memnode(m) => m,
        })
    }

    #[test]
    fn both_forms_parse() {
        Top::command().debug_assert();
        let m = parse(&[
            "--listen",
            "unix:/tmp/x.sock",
            "--capacity",
            "1G",
            "--lease",
            "1.5",
        ])
        .unwrap();
        assert!(m.command.is_none());
        assert_eq!(m.serve.listen, Endpoint::Unix("/tmp/x.sock".into()));
        assert_eq!(m.serve.capacity, Some(1 << 30));
        assert_eq!(m.serve.lease, Duration::from_millis(1500));
        assert!(!m.serve.exit_on_stdin_eof);
        assert_eq!(m.serve.bandwidth, None);
        let m = parse(&["--bandwidth", "100M"]).unwrap();
        assert_eq!(m.serve.bandwidth, Some(100 << 20));
        assert!(parse(&["--bandwidth", "0"]).is_err());
        let m = parse(&[]).unwrap();
        assert_eq!(m.serve.listen, Endpoint::Tcp(DEFAULT_ADDR.into()));
        assert_eq!(m.serve.lease, Duration::from_secs(10));
        assert_eq!(m.serve.capacity, None);
        let m = parse(&["stats", "--addr", "10.0.0.1:9"]).unwrap();
        match m.command {
            Some(MemnodeSubcommand::Stats(s)) => {
                assert_eq!(s.addr, Endpoint::Tcp("10.0.0.1:9".into()))
            }
            _ => panic!("stats subcommand not parsed"),
        }
        let m = parse(&["drain", "--addr", "10.0.0.1:9", "--timeout", "5"]).unwrap();
        match m.command {
            Some(MemnodeSubcommand::Drain(d)) => {
                assert_eq!(d.addr, Endpoint::Tcp("10.0.0.1:9".into()));
                assert_eq!(d.timeout, 5);
            }
            _ => panic!("drain subcommand not parsed"),
        }
        // `--memnode`, the name `gleaner run` gives the address, is accepted too.
        for sub in ["stats", "drain"] {
            let m = parse(&[sub, "--memnode", "unix:/tmp/m.sock"]).unwrap();
            let addr = match m.command {
                Some(MemnodeSubcommand::Stats(s)) => s.addr,
                Some(MemnodeSubcommand::Drain(d)) => d.addr,
                None => panic!("{sub} not parsed"),
            };
            assert_eq!(addr, Endpoint::Unix("/tmp/m.sock".into()), "{sub}");
        }
        let m = parse(&[
            "--tenant",
            "batch:/etc/g:x/tok:2G:3",
            "--tenant",
            "lc:t:512M:1",
        ])
        .unwrap();
        assert_eq!(
            m.serve.tenant[0],
            TenantSpec {
                name: "batch".into(),
                token_file: "/etc/g:x/tok".into(),
                quota: 2 << 30,
                weight: 3
            }
        );
        assert_eq!(m.serve.tenant[1].quota, 512 << 20);
        for bad in ["x", "a:b:1G", ":t:1G:1", "a:t:1Q:1", "a:t:1G:0", "a::1G:1"] {
            assert!(parse(&["--tenant", bad]).is_err(), "{bad}");
        }
        assert!(parse(&["--listen", "nonsense"]).is_err());
        assert!(parse(&["--lease", "-1"]).is_err());
        assert!(parse(&["--capacity", "12Q"]).is_err());
    }

    #[test]
    fn meminfo_is_readable() {
        assert!(mem_available().unwrap() > 0);
    }
}
