//! Resolving the engine URL and probing it once at start-up.

use std::time::Duration;

/// Default engine URL of the SDKs.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:49134";

/// `--url`, else `III_URL`, else `III_ENGINE_URL`, else the default.
pub fn resolve_url(flag: Option<&str>) -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    flag.map(str::to_string)
        .or_else(|| env("III_URL"))
        .or_else(|| env("III_ENGINE_URL"))
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// `host:port` of a `ws://` or `wss://` URL (default ports 80/443).
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let default_port = if scheme.eq_ignore_ascii_case("wss") {
        443
    } else {
        80
    };
    if let Some(stripped) = authority.strip_prefix('[') {
        let (host, after) = stripped.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .map(|p| p.parse().ok())
            .unwrap_or(Some(default_port))?;
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default_port)),
    }
}

/// `host:port` as written in a URL or a socket address: an IPv6 host in brackets.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The base URL channels are opened under (`ws://host:port`).
pub fn base_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
            format!("{scheme}://{authority}")
        }
        None => url.to_string(),
    }
}

/// Worker name: `III_WORKER_NAME`, else `shell`.
pub fn worker_name() -> String {
    std::env::var("III_WORKER_NAME")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "shell".into())
}

/// Namespace: `III_NAMESPACE`; blank means unset.
pub fn namespace() -> Option<String> {
    std::env::var("III_NAMESPACE")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Probes the engine once, detached, and logs one ERROR if nothing listens there. Never
/// delays start-up.
pub fn spawn_probe(url: &str) {
    let Some((host, port)) = host_port(url) else {
        tracing::error!(
            url,
            "engine URL is not a ws:// or wss:// URL: set --url or the III_URL env var"
        );
        return;
    };
    tokio::spawn(async move {
        let addr = authority(&host, port);
        let ok = matches!(
            tokio::time::timeout(
                Duration::from_secs(3),
                tokio::net::TcpStream::connect(&addr)
            )
            .await,
            Ok(Ok(_))
        );
        if !ok {
            tracing::error!(
                "engine unreachable at {addr} — is the iii engine running? Start it, or set --url or the III_URL env var to where it listens. Retrying every 2s."
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            host_port("ws://127.0.0.1:49134"),
            Some(("127.0.0.1".into(), 49134))
        );
        assert_eq!(host_port("ws://engine/"), Some(("engine".into(), 80)));
        assert_eq!(
            host_port("wss://u:p@h.example:9/x?y"),
            Some(("h.example".into(), 9))
        );
        assert_eq!(host_port("ws://[::1]:7"), Some(("::1".into(), 7)));
        assert_eq!(base_url("ws://h:1/some/path?q"), "ws://h:1");
        assert_eq!(authority("::1", 7), "[::1]:7");
        assert_eq!(authority("127.0.0.1", 7), "127.0.0.1:7");
        assert_eq!(authority("engine", 80), "engine:80");
    }
}
