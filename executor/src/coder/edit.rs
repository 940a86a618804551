//! `coder::create-file` and `coder::update-file`.
use iii_shell_protocol::coder::*;

use super::paths::{CErr, Ctx};

pub fn create_files(_ctx: &Ctx<'_>, req: &CreateFileInput) -> CreateFileOutput {
    CreateFileOutput {
        results: req
            .files
            .iter()
            .map(|f| CreateFileResult {
                path: f.path.clone(),
                success: false,
                bytes_written: 0,
                revision: None,
                error: Some(CErr::io("not implemented yet").entry()),
            })
            .collect(),
    }
}

pub fn update_files(_ctx: &Ctx<'_>, specs: &[EditSpec]) -> UpdateFileOutput {
    UpdateFileOutput {
        results: specs
            .iter()
            .map(|f| UpdateFileResult {
                path: f.path.clone(),
                success: false,
                applied: 0,
                new_line_count: 0,
                echoes: vec![],
                echoes_truncated: false,
                error: Some(CErr::io("not implemented yet").entry()),
            })
            .collect(),
    }
}
