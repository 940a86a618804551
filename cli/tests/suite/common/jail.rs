//! A jail next to an "outside" directory holding a secret, for suites that check that nothing
//! crosses the jail's edge.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use iii_shell_protocol::config::Config;

use super::{bin, canon, jailed, s, tempdir, Harness};

pub const SECRET: &[u8] = b"OUTSIDE SECRET";

/// The canonical directory of the `iii-shell` binary (granted read/exec in jailed configs so
/// commands can run `iii-shell probe`).
pub fn bin_dir() -> PathBuf {
    canon(bin()).parent().unwrap().to_path_buf()
}

/// `<tmp>/root` (the jail) next to `<tmp>/outside` (holding `secret.txt`, mode 0640).
/// Everything is canonical, and `<tmp>` is world-traversable.
pub struct Jail {
    _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub root: PathBuf,
    pub outside: PathBuf,
}

impl Jail {
    pub fn new() -> Jail {
        let dir = tempdir();
        let base = canon(dir.path());
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
        std::fs::set_permissions(
            outside.join("secret.txt"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        Jail {
            _dir: dir,
            base,
            root,
            outside,
        }
    }

    /// Jailed to `root`. No scratch paths (the temp dirs live under /tmp, a default scratch
    /// path, which would make "outside" writable), and the binary's directory is a system path.
    pub fn config(&self) -> Config {
        let mut c = jailed(&self.root);
        c.confinement.scratch_paths = Vec::new();
        c.confinement.system_paths.push(s(&bin_dir()));
        c
    }

    pub async fn harness(&self) -> Harness {
        Harness::new(self.config()).await
    }

    /// Names in `outside`.
    pub fn outside_names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Nothing appeared in `outside`, and `secret.txt` kept its bytes and mode.
    pub fn outside_untouched(&self) {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            self.outside_names(),
            ["secret.txt"],
            "something appeared outside the jail"
        );
        assert_eq!(
            std::fs::read(self.outside.join("secret.txt")).unwrap(),
            SECRET,
            "the outside file changed"
        );
        let md = std::fs::symlink_metadata(self.outside.join("secret.txt")).unwrap();
        assert!(md.file_type().is_file());
        assert_eq!(md.mode() & 0o7777, 0o640, "the outside file's mode changed");
    }
}
