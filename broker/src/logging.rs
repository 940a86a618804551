//! Log setup: `tracing` to stderr, filtered by `RUST_LOG`, and optionally a second layer
//! that ships events to the engine ([`init_with`]).
//!
//! One line per event. Colours only when stderr is a terminal (and `NO_COLOR` is unset).
//! Under systemd (stderr is the journal stream named in `JOURNAL_STREAM`) every line starts
//! with its syslog priority (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug and trace),
//! which journald strips and stores, so `journalctl -p err -u iii-shell-broker` works, and
//! carries no timestamp of its own (the journal stamps every line).

use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{DefaultFields, Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// A layer beside the stderr log (what ships events to the engine).
pub type Extra = Box<dyn Layer<Registry> + Send + Sync>;

/// The syslog priority journald reads from a `<N>` line prefix.
pub fn syslog_priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Whether stderr is the journal stream systemd connected us to: `JOURNAL_STREAM` is
/// `<device>:<inode>` of that stream (see systemd.exec(5)), and it is inherited by children,
/// so it is compared with what stderr really is.
fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// The default format behind a `<priority>` prefix.
struct Journald(Format<Full, ()>);

impl<S, N> FormatEvent<S, N> for Journald
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write!(writer, "<{}>", syslog_priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Sets up the log: `RUST_LOG` when set, `default_filter` otherwise. Call it from `main`,
/// before any other thread exists.
pub fn init(default_filter: &str) {
    init_with(default_filter, None)
}

/// [`init`] with `extra` beside the stderr log. `extra` sees events up to INFO whatever
/// `RUST_LOG` says (it decides itself what it keeps); stderr shows what `RUST_LOG` selects,
/// exactly as without it.
///
/// When `RUST_LOG` is unset it is set to `default_filter`, so the processes this one starts
/// (`serve`'s broker, a broker's or `call`'s executor) inherit the level it chose: the
/// environment carries it, not a static of ours.
pub fn init_with(default_filter: &str, extra: Option<Extra>) {
    if std::env::var_os("RUST_LOG").is_none() {
        // Sound only while this is the one thread, which is why `main` calls it first.
        std::env::set_var("RUST_LOG", default_filter);
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let stderr: Extra = if stderr_is_journal() {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .fmt_fields(DefaultFields::new())
            .event_format(Journald(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_ansi(false),
            ))
            .with_filter(filter)
            .boxed()
    } else {
        let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed()
    };
    let mut layers = vec![stderr];
    if let Some(e) = extra {
        layers.push(e.with_filter(LevelFilter::INFO).boxed());
    }
    let _ = tracing_subscriber::registry().with(layers).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_syslog_levels() {
        assert_eq!(syslog_priority(&Level::ERROR), 3);
        assert_eq!(syslog_priority(&Level::WARN), 4);
        assert_eq!(syslog_priority(&Level::INFO), 6);
        assert_eq!(syslog_priority(&Level::DEBUG), 7);
        assert_eq!(syslog_priority(&Level::TRACE), 7);
    }
}
