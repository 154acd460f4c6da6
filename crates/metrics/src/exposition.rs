//! The Prometheus text exposition format, version 0.0.4: one `# HELP` and one `# TYPE` line
//! per family, then its samples, `name{label="value",...} number`.

use std::fmt::Write;

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    /// A value that only grows (its name ends in `_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
        }
    }
}

/// A document being written: families are added one after another, each with its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    /// The family being written (its samples must carry its name).
    current: Option<String>,
}

/// The content type of the text format, for HTTP.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Exposition {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines. A counter's name must end in
    /// `_total` (checked in debug builds).
    pub fn family(&mut self, name: &str, kind: MetricType, help: &str) -> &mut Self {
        debug_assert!(valid_name(name), "bad metric name {name}");
        debug_assert!(
            kind != MetricType::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.as_str());
        self.current = Some(name.to_string());
        self
    }

    /// A sample of the current family with `labels` (name, value pairs; values escaped here).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let name = self
            .current
            .as_deref()
            .expect("a sample needs a family first");
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k), "bad label name {k}");
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", format_value(value));
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: MetricType, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(&[], value)
    }

    /// The document.
    pub fn finish(self) -> String {
        self.text
    }
}

/// Whether `name` is a valid metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A label value with `\`, `"` and newlines escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value: integers without a fraction, `NaN` and `+Inf` as the format spells them.
fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples_are_written_in_the_text_format() {
        let mut e = Exposition::new();
        e.single("x_bytes", MetricType::Gauge, "Bytes.\nSecond line", 4096.0);
        e.family("y_total", MetricType::Counter, "Things.")
            .sample(&[("kind", "a\"b\\c\nd")], 1.5)
            .sample(&[("kind", "e"), ("tenant", "t")], f64::NAN);
        assert_eq!(
            e.finish(),
            "# HELP x_bytes Bytes.\\nSecond line\n# TYPE x_bytes gauge\nx_bytes 4096\n\
             # HELP y_total Things.\n# TYPE y_total counter\n\
             y_total{kind=\"a\\\"b\\\\c\\nd\"} 1.5\ny_total{kind=\"e\",tenant=\"t\"} NaN\n"
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("gleaner_memnode_used_bytes"));
        assert!(!valid_name("9x"));
        assert!(!valid_name("a-b"));
        assert!(!valid_name(""));
    }
}
