//! What the checker does, from `SQDISC_CHECK*` environment variables or the C API.

/// What happens at a violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing is checked; every call goes straight to the provider.
    Off = 0,
    /// Violations are recorded; the report is written at exit.
    Log = 1,
    /// The first violation writes the report and aborts the process.
    Abort = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    /// Every how many send WRs with a source buffer one is checksummed (0: never).
    pub sample_every: u32,
    /// Bytes of a sampled WR's source that are checksummed (its first bytes, SGE by SGE).
    pub sample_bytes: u32,
    /// An SQ with an unsignaled tail and no post for this long is reported (0: never).
    pub idle_ms: u32,
    /// Occurrences of each kind kept for the report.
    pub first: u32,
    /// Where the report goes (None: standard error). `%p` is replaced by the process id.
    pub report_path: Option<String>,
    /// Write the report when SIGINT or SIGTERM ends the process.
    pub on_signal: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mode: Mode::Log,
            sample_every: 64,
            sample_bytes: 4096,
            idle_ms: 1000,
            first: 10,
            report_path: None,
            on_signal: true,
        }
    }
}

impl Config {
    /// Reads the configuration through `var` (the environment, in the library). A value that does not parse
    /// keeps the default and is named in the returned warnings.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> (Config, Vec<String>) {
        let mut c = Config::default();
        let mut warnings = Vec::new();
        if let Some(v) = var("SQDISC_CHECK") {
            match v.as_str() {
                "" | "log" | "1" => c.mode = Mode::Log,
                "abort" => c.mode = Mode::Abort,
                "off" | "0" => c.mode = Mode::Off,
                other => warnings.push(format!("SQDISC_CHECK={other} is not log, abort or off: log")),
            }
        }
        let mut num = |name: &str, slot: &mut u32| {
            if let Some(v) = var(name) {
                match v.parse::<u32>() {
                    Ok(n) => *slot = n,
                    Err(_) => warnings.push(format!("{name}={v} is not a number: ignored")),
                }
            }
        };
        num("SQDISC_CHECK_SAMPLE", &mut c.sample_every);
        num("SQDISC_CHECK_SAMPLE_BYTES", &mut c.sample_bytes);
        num("SQDISC_CHECK_IDLE_MS", &mut c.idle_ms);
        num("SQDISC_CHECK_FIRST", &mut c.first);
        let mut signals = u32::from(c.on_signal);
        num("SQDISC_CHECK_SIGNALS", &mut signals);
        c.on_signal = signals != 0;
        c.report_path = var("SQDISC_CHECK_REPORT").filter(|p| !p.is_empty());
        (c, warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_and_bad_ones() {
        let (c, w) = Config::from_vars(|k| match k {
            "SQDISC_CHECK" => Some("abort".into()),
            "SQDISC_CHECK_SAMPLE" => Some("1".into()),
            "SQDISC_CHECK_IDLE_MS" => Some("x".into()),
            "SQDISC_CHECK_REPORT" => Some("/tmp/r.%p".into()),
            _ => None,
        });
        assert_eq!(c.mode, Mode::Abort);
        assert_eq!(c.sample_every, 1);
        assert_eq!(c.idle_ms, 1000);
        assert_eq!(c.report_path.as_deref(), Some("/tmp/r.%p"));
        assert_eq!(w.len(), 1);
    }
}
