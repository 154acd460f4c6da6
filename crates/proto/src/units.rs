//! Human-readable sizes (`512M`, `1G`, `4096`) and the default token location, shared by every
//! gleaner component that takes them from a command line or an environment variable.

use std::path::PathBuf;

/// Parses a size such as `4096`, `64K`, `512M`, `1G`, `1.5G` or `2GiB` into bytes
/// (binary multiples: K = 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "`{s}`: unknown size unit `{other}` (use K, M, G or T)"
            ))
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 4096, 64K, 512M, 1G)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("`{s}` is not a valid size"));
    }
    Ok((value * mult as f64) as u64)
}

/// Formats a byte count with a binary unit, e.g. `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Where the memnode token lives unless a flag says otherwise:
/// `$GLEANER_TOKEN_FILE`, else `$HOME/.gleaner/token`, else `/tmp/gleaner-$UID/token`.
pub fn default_token_path() -> PathBuf {
    if let Some(p) = std::env::var_os("GLEANER_TOKEN_FILE") {
        return PathBuf::from(p);
    }
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home).join(".gleaner").join("token"),
        // No home directory: fall back to a per-user directory under /tmp.
        _ => PathBuf::from(format!("/tmp/gleaner-{}/token", current_uid())),
    }
}

fn current_uid() -> u32 {
    gleaner_fds::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert!(parse_size("12Q").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(format_size(1536 << 20), "1.50 GiB");
        assert_eq!(format_size(10), "10 B");
    }
}
