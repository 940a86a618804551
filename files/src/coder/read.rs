//! `coder::read-file`: stat probes, full reads (with a revision), line windows of files of
//! any size, and batches under one aggregate budget.
//!
//! Budgets (CODER-21/22/27): a single full read returns at most `max_output_bytes` (or the
//! per-call override, clamped to `max_read_bytes`) and fails C218 beyond; a window returns at
//! most `max_read_bytes` and is cut at a line boundary (`more_lines: true`); a batch entry
//! returns at most `min(remaining batch budget, max_read_bytes)`, cut the same way. A file is
//! never read further than its window (plus one buffer), and never wholly into memory unless
//! it is a full read within its budget.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::fd::OwnedFd;

use base64::Engine;
use iii_shell_protocol::coder::*;
use iii_shell_protocol::Code;

use super::lines::{count_lines, read_window, rendered_len, scan, Window};
use super::paths::{display, perm_bits, revision, CErr, Ctx};
use crate::fs::entry::{is_dir, is_file};
use crate::jail::fstat;

/// An opened regular file.
pub struct Opened {
    pub file: File,
    pub st: libc::stat,
    pub path: String,
}

/// Opens `input` for reading through the jail; directories and non-regular files are C210.
pub fn open_file(ctx: &Ctx<'_>, input: &str) -> Result<Opened, CErr> {
    // O_NONBLOCK: opening a FIFO must not wedge the call (it is refused just below).
    let r = ctx.resolve(input, libc::O_RDONLY | libc::O_NONBLOCK)?;
    let st = fstat(&r.fd).map_err(|e| CErr::io(format!("stat {input}: {e}")))?;
    if is_dir(&st) {
        return Err(CErr::invalid(format!(
            "is a directory: {input}; list it with coder::list-folder or coder::tree"
        )));
    }
    if !is_file(&st) {
        return Err(CErr::invalid(format!("not a regular file: {input}")));
    }
    let fd: OwnedFd = r.fd;
    Ok(Opened {
        file: File::from(fd),
        st,
        path: display(&r.path),
    })
}

fn io_err(input: &str) -> impl Fn(std::io::Error) -> CErr + '_ {
    move |e| CErr::io(format!("read {input}: {e}"))
}

pub fn read(ctx: &Ctx<'_>, spec: &ReadSpec) -> Result<ReadFileOutput, CErr> {
    check_read(spec).map_err(CErr::invalid)?;
    if let Some(items) = &spec.paths {
        return Ok(ReadFileOutput {
            results: Some(batch(ctx, items)),
            ..Default::default()
        });
    }
    let input = spec.path.as_deref().unwrap_or_default();
    let mut f = open_file(ctx, input)?;
    let size = f.st.st_size as u64;
    let mut out = ReadFileOutput {
        path: Some(f.path.clone()),
        size: Some(size),
        mode: Some(perm_bits(&f.st)),
        mtime: Some(f.st.st_mtime),
        ..Default::default()
    };
    if spec.stat {
        let scanned = scan(&mut f.file, ctx.max_read()).map_err(io_err(input))?;
        out.total_lines = scanned.map(|s| s.0);
        out.is_utf8 = scanned.map(|s| s.1);
        return Ok(out);
    }
    if spec.line_from.is_some() || spec.line_to.is_some() {
        let from = spec.line_from.unwrap_or(1);
        let mut r = BufReader::with_capacity(64 * 1024, &mut f.file);
        let w = read_window(&mut r, from, spec.line_to, ctx.max_read(), spec.numbered)
            .map_err(io_err(input))?;
        check_first_line(&w, input, from, ctx.max_read())?;
        out.content = Some(w.content);
        out.lines_returned = Some(w.lines);
        out.total_lines = w.total;
        out.more_lines = Some(w.more);
        out.is_utf8 = Some(w.utf8);
        return Ok(out);
    }
    // A full read.
    let budget = spec
        .max_output_bytes
        .unwrap_or(ctx.policy.config.max_output_bytes)
        .min(ctx.max_read());
    let budget = if budget == 0 { u64::MAX } else { budget };
    if size > ctx.max_read() {
        return Err(CErr::too_large(format!(
            "{input} is {size} bytes, over max_read_bytes ({}): read it in windows (line_from/line_to) or probe it with stat: true",
            ctx.max_read()
        )));
    }
    let bytes = read_all(&mut f.file, ctx.max_read(), input)?;
    let total = count_lines(&bytes);
    let over = |returned: u64| {
        CErr::new(
            Code::C218,
            format!(
                "{input} is {size} bytes ({total} lines); a full read would return {returned} bytes, over the budget of {budget} bytes: read a window (line_from/line_to), probe with stat: true, or raise max_output_bytes (up to max_read_bytes, {})",
                ctx.max_read()
            ),
        )
    };
    out.revision = Some(revision(&bytes));
    out.total_lines = Some(total);
    out.lines_returned = Some(total);
    out.more_lines = Some(false);
    if spec.base64 {
        let enc = base64::engine::general_purpose::STANDARD.encode(&bytes);
        if enc.len() as u64 > budget {
            return Err(over(enc.len() as u64));
        }
        out.is_utf8 = Some(std::str::from_utf8(&bytes).is_ok());
        out.content = Some(enc);
        return Ok(out);
    }
    let w = read_window(&mut &bytes[..], 1, None, budget, spec.numbered).map_err(io_err(input))?;
    if w.more {
        // Lossy replacement and prefixes only grow the text: its size is at least the file's.
        return Err(over(rendered_len(&bytes, spec.numbered)));
    }
    out.is_utf8 = Some(w.utf8);
    out.content = Some(w.content);
    Ok(out)
}

/// C218 for a window that returned nothing because its first line (`from`) is longer than
/// its cap: a window keeps whole lines, so no window can return that line as text.
fn check_first_line(w: &Window, input: &str, from: u64, cap: u64) -> Result<(), CErr> {
    if w.lines > 0 || !w.more {
        return Ok(());
    }
    Err(CErr::too_large(format!(
        "line {from} of {input} is longer than a window can return (max_read_bytes, {cap}): read its bytes with shell::workspace::read-bytes (the line starts at offset {})",
        w.offset
    )))
}

/// Reads a whole file of at most `limit` bytes (C218 when it grew past it meanwhile).
fn read_all(file: &mut File, limit: u64, input: &str) -> Result<Vec<u8>, CErr> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_err(input))?;
    if bytes.len() as u64 > limit {
        return Err(CErr::too_large(format!(
            "{input} grew past max_read_bytes ({limit}) while it was read: read it in windows (line_from/line_to)"
        )));
    }
    Ok(bytes)
}

fn failed(path: &str, e: CErr) -> ReadEntryResult {
    ReadEntryResult {
        path: path.to_string(),
        success: false,
        error: Some(e.entry()),
        ..Default::default()
    }
}

/// A batch, in order, against `BATCH_READ_BUDGET_BYTES`.
fn batch(ctx: &Ctx<'_>, items: &[ReadItem]) -> Vec<ReadEntryResult> {
    let mut used: u64 = 0;
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if let Err(e) = check_entry(item) {
            out.push(failed(&item.path, CErr::invalid(e)));
            continue;
        }
        let remaining = BATCH_READ_BUDGET_BYTES.saturating_sub(used);
        if !item.stat && remaining == 0 {
            out.push(failed(
                &item.path,
                CErr::too_large(format!(
                    "batch_read_budget_bytes ({BATCH_READ_BUDGET_BYTES}) is spent: {used} bytes were already returned by earlier entries; read {} in a separate call (or a window of it)",
                    item.path
                )),
            ));
            continue;
        }
        match entry(ctx, item, remaining.min(ctx.max_read())) {
            Ok(r) => {
                used += r.content.as_ref().map_or(0, |c| c.len() as u64);
                out.push(r);
            }
            Err(e) => out.push(failed(&item.path, e)),
        }
    }
    out
}

fn entry(ctx: &Ctx<'_>, item: &ReadItem, cap: u64) -> Result<ReadEntryResult, CErr> {
    let mut f = open_file(ctx, &item.path)?;
    let mut r = ReadEntryResult {
        path: f.path.clone(),
        success: true,
        size: Some(f.st.st_size as u64),
        mode: Some(perm_bits(&f.st)),
        mtime: Some(f.st.st_mtime),
        ..Default::default()
    };
    if item.stat {
        let scanned = scan(&mut f.file, ctx.max_read()).map_err(io_err(&item.path))?;
        r.total_lines = scanned.map(|s| s.0);
        r.is_utf8 = scanned.map(|s| s.1);
        return Ok(r);
    }
    let windowed = item.line_from.is_some() || item.line_to.is_some();
    if !windowed && f.st.st_size as u64 > ctx.max_read() {
        return Err(CErr::too_large(format!(
            "{} is {} bytes, over max_read_bytes ({}): read it in windows (line_from/line_to) or probe it with stat: true",
            item.path,
            f.st.st_size,
            ctx.max_read()
        )));
    }
    let mut reader = BufReader::with_capacity(64 * 1024, &mut f.file);
    let w = read_window(
        &mut reader,
        item.line_from.unwrap_or(1),
        item.line_to,
        cap,
        item.numbered,
    )
    .map_err(io_err(&item.path))?;
    if cap >= ctx.max_read() {
        // Cut by max_read_bytes itself, not by what is left of the batch's budget (a call
        // of its own returns that line).
        check_first_line(&w, &item.path, item.line_from.unwrap_or(1), cap)?;
    }
    r.content = Some(w.content);
    r.lines_returned = Some(w.lines);
    r.total_lines = w.total;
    r.more_lines = Some(w.more);
    r.is_utf8 = Some(w.utf8);
    Ok(r)
}
