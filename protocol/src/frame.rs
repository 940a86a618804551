//! Length-prefixed postcard frames.
//!
//! Each frame is a 4-byte big-endian length followed by that many bytes of postcard. A frame
//! longer than [`MAX_FRAME_BYTES`] is refused before its body is read, so a hostile or broken
//! peer cannot make the reader allocate without bound.

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame either side accepts: two full 16 MiB output buffers plus headroom.
pub const MAX_FRAME_BYTES: usize = 40 << 20;

/// What a reply that grows with its input (`fs::grep` matches, say) may occupy while it is
/// built: below [`MAX_FRAME_BYTES`], so such a reply is cut (`truncated: true`, or S218 where
/// the schema has no flag) long before the frame limit would refuse it.
pub const REPLY_BUDGET_BYTES: usize = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `value` as one frame (length prefix included).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let buf = vec![0u8; 4];
    let body = postcard::to_extend(value, buf)?;
    let len = body.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = body;
    body[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(body)
}

/// Writes one frame and flushes.
pub async fn write_frame<W, T>(w: &mut W, value: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let bytes = encode(value)?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(())
}

/// Buffer for the read half of a connection (`tokio::io::BufReader::with_capacity`): a small
/// frame then arrives in one read instead of one for its length and one for its body.
pub const READ_BUFFER: usize = 64 * 1024;

/// Reads one frame. A clean EOF before the length prefix is [`FrameError::Closed`].
pub async fn read_frame<R, T>(r: &mut R) -> Result<T, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(postcard::from_bytes(&body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_and_limits() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, &("hello".to_string(), 7u64))
            .await
            .unwrap();
        let got: (String, u64) = read_frame(&mut b).await.unwrap();
        assert_eq!(got, ("hello".to_string(), 7));

        // An announced length over the limit is refused without reading the body.
        a.write_all(&((MAX_FRAME_BYTES as u32) + 1).to_be_bytes())
            .await
            .unwrap();
        let err = read_frame::<_, String>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge(_)), "{err}");

        drop(a);
        let err = read_frame::<_, String>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::Closed), "{err}");
    }
}
