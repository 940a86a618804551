//! `coder::search`.
use iii_shell_protocol::coder::*;

use super::paths::{CErr, Ctx};

pub fn search(_ctx: &Ctx<'_>, _req: &SearchInput) -> Result<SearchOutput, CErr> {
    Err(CErr::io("coder::search is not implemented yet"))
}
