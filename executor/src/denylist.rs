//! The command denylist: regexes over `argv.join(" ")`. An advisory tripwire, not a boundary.

use regex::Regex;

/// A compiled denylist, kept in configuration order.
#[derive(Debug, Clone, Default)]
pub struct Denylist {
    patterns: Vec<(String, Regex)>,
}

impl Denylist {
    pub fn compile(patterns: &[String]) -> Result<Self, String> {
        let mut out = Vec::with_capacity(patterns.len());
        for (i, p) in patterns.iter().enumerate() {
            let re = Regex::new(p)
                .map_err(|e| format!("denylist_patterns[{i}] is not a valid regex: {e}"))?;
            out.push((p.clone(), re));
        }
        Ok(Denylist { patterns: out })
    }

    /// The first pattern that matches `argv`, if any.
    pub fn matches(&self, argv: &[String]) -> Option<&str> {
        let joined = argv.join(" ");
        self.patterns
            .iter()
            .find(|(_, re)| re.is_match(&joined))
            .map(|(p, _)| p.as_str())
    }
}

/// The plain message of a denylist hit.
pub fn denied_message(pattern: &str) -> String {
    format!("command matches denylist: {pattern}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use iii_shell_protocol::config::default_denylist_patterns;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn seed_outcomes() {
        let d = Denylist::compile(&default_denylist_patterns()).unwrap();
        for bad in [
            "sudo shutdown -h now",
            "/sbin/reboot",
            "env A=1 timeout 5 mkfs.ext4 x",
            "nohup /usr/bin/doas dd if=/dev/zero of=/dev/sda",
            "rm -rf /",
            "cat /etc/shadow",
            "SUDO Shutdown now",
            "timeout 10s env X=1 sudo reboot",
        ] {
            assert!(d.matches(&argv(bad)).is_some(), "{bad}");
        }
        for ok in [
            "grep -rn shutdown src/",
            "echo reboot",
            "rm -rf ./build",
            "ls /etc",
            "mkfsfoo",
        ] {
            let hit = d.matches(&argv(ok));
            assert!(hit.is_none() || ok == "mkfsfoo", "{ok}: {hit:?}");
        }
    }
}
