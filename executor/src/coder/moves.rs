//! `coder::move`.
use iii_shell_protocol::coder::*;

use super::paths::{CErr, Ctx};

pub fn move_files(_ctx: &Ctx<'_>, req: &MoveFileInput) -> MoveFileOutput {
    MoveFileOutput {
        results: req
            .files
            .iter()
            .map(|f| MoveFileResult {
                from: f.from.clone(),
                to: f.to.clone(),
                moved: false,
                success: false,
                error: Some(CErr::io("not implemented yet").entry()),
            })
            .collect(),
    }
}
