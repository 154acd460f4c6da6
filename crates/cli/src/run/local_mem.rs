//! `--local-mem`: one size (a fixed local budget) or a range `FLOOR..CEILING` (an elastic
//! budget the node daemon moves between the two as the machine's programs and soft pools need:
//! `gleaner_pager`'s `evict/elastic.rs`, `gleaner_node`'s `elastic.rs`).

use gleaner_proto::units::{format_size, parse_size};

/// A parsed `--local-mem`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalMem {
    /// The fixed budget, or an elastic budget's floor, bytes.
    pub(crate) floor: u64,
    /// An elastic budget's ceiling, bytes (None: fixed).
    pub(crate) ceiling: Option<u64>,
}

/// Parses `512M` (fixed) or `256M..2G` (elastic). `A..A` is a fixed budget of `A`.
pub(crate) fn parse(s: &str) -> Result<LocalMem, String> {
    let Some((lo, hi)) = s.split_once("..") else {
        return Ok(LocalMem {
            floor: parse_size(s)?,
            ceiling: None,
        });
    };
    if lo.trim().is_empty() || hi.trim().is_empty() {
        return Err(format!(
            "`{s}`: give both ends of the range, FLOOR..CEILING (e.g. 256M..2G)"
        ));
    }
    if hi.contains("..") {
        return Err(format!(
            "`{s}`: give one range, FLOOR..CEILING (e.g. 256M..2G)"
        ));
    }
    let floor = parse_size(lo).map_err(|e| format!("the floor: {e}"))?;
    let ceiling = parse_size(hi).map_err(|e| format!("the ceiling: {e}"))?;
    if floor > ceiling {
        return Err(format!(
            "`{s}`: the floor ({}) is above the ceiling ({}); give FLOOR..CEILING, the smaller first",
            format_size(floor),
            format_size(ceiling)
        ));
    }
    Ok(LocalMem {
        floor,
        ceiling: (ceiling > floor).then_some(ceiling),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_size_is_fixed_and_a_range_is_elastic() {
        assert_eq!(
            parse("512M").unwrap(),
            LocalMem {
                floor: 512 << 20,
                ceiling: None
            }
        );
        assert_eq!(
            parse("256M..2G").unwrap(),
            LocalMem {
                floor: 256 << 20,
                ceiling: Some(2 << 30)
            }
        );
        assert_eq!(parse("1.5G..2G").unwrap().floor, 3 << 29);
        assert_eq!(
            parse("1G..1G").unwrap().ceiling,
            None,
            "an empty range is fixed"
        );
    }

    #[test]
    fn bad_ranges_say_what_is_wrong() {
        let e = parse("2G..256M").unwrap_err();
        assert!(e.contains("above the ceiling"), "{e}");
        for s in ["..2G", "256M..", ".."] {
            let e = parse(s).unwrap_err();
            assert!(e.contains("both ends"), "{s}: {e}");
        }
        assert!(parse("256M..2X").unwrap_err().contains("the ceiling"));
        assert!(parse("abc..2G").unwrap_err().contains("the floor"));
        assert!(parse("1G..2G..3G").unwrap_err().contains("one range"));
    }
}
