//! Reading the process table from `/proc`.

/// One row of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: u8,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
}

/// Parses `/proc/<pid>/stat`. The command name may contain spaces and parentheses, so the
/// fields are read after the *last* `)`.
pub fn stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

pub fn parse_stat(pid: i32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut it = rest.split_ascii_whitespace();
    let state = it.next()?.bytes().next()?;
    let ppid = it.next()?.parse().ok()?;
    let pgid = it.next()?.parse().ok()?;
    let sid = it.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        pgid,
        sid,
    })
}

/// Every process visible in `/proc`.
pub fn all() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

/// Children of this process (every thread's `children` file), falling back to a full scan.
pub fn own_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let mut any = false;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                any = true;
                out.extend(
                    s.split_ascii_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    if !any {
        out = all()
            .into_iter()
            .filter(|p| p.ppid == me)
            .map(|p| p.pid)
            .collect();
    }
    out
}

/// `root` and all its descendants, following parent links.
pub fn descendants(root: i32, table: &[ProcStat]) -> Vec<i32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(
            table
                .iter()
                .filter(|p| p.ppid == parent && p.pid != parent)
                .map(|p| p.pid),
        );
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_parens() {
        let s = parse_stat(7, "7 (a) b) (c) S 1 7 7 0 -1").unwrap();
        assert_eq!((s.state, s.ppid, s.pgid, s.sid), (b'S', 1, 7, 7));
        assert!(stat(std::process::id() as i32).is_some());
    }
}
