//! `coder::delete-file`.
use iii_shell_protocol::coder::*;

use super::paths::{CErr, Ctx};

pub fn delete_files(_ctx: &Ctx<'_>, req: &DeleteFileInput) -> DeleteFileOutput {
    DeleteFileOutput {
        results: req
            .paths
            .iter()
            .map(|p| DeleteFileResult {
                path: p.clone(),
                success: false,
                removed: false,
                error: Some(CErr::io("not implemented yet").entry()),
            })
            .collect(),
    }
}
