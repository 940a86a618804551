//! Data channels (§7).

mod common;

use std::time::Duration;

use common::WAIT;
use futures_util::{SinkExt, StreamExt};
use iii_test_engine::{ChannelDirection, Message, TestEngine};
use serde_json::json;
use tokio_tungstenite::tungstenite::{self, http::StatusCode};

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test]
async fn create_returns_matching_refs() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let refs = client
        .call("engine::channels::create", json!({"buffer_size": null}))
        .await
        .unwrap();
    assert_eq!(refs["writer"]["direction"], "write");
    assert_eq!(refs["reader"]["direction"], "read");
    assert_eq!(refs["writer"]["channel_id"], refs["reader"]["channel_id"]);
    assert_eq!(refs["writer"]["access_key"], refs["reader"]["access_key"]);
    let err = client
        .call("engine::channels::create", json!(null))
        .await
        .unwrap_err();
    assert_eq!(err.code, "deserialization_error");
}

#[tokio::test]
async fn round_trips_one_mebibyte_with_text_frames_and_close_as_eof() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel().await;
    assert_eq!(writer.direction, ChannelDirection::Write);

    let data = pattern(1024 * 1024);
    let mut chunks = vec![Message::text(r#"{"meta":"first text frame"}"#)];
    chunks.extend(data.chunks(64 * 1024).map(|c| Message::binary(c.to_vec())));
    chunks.push(Message::text(r#"{"error":"late"}"#));
    // 18 messages fit the default 64-message buffer: write everything first.
    client.write_channel(&writer, chunks).await;

    let messages = client.read_channel(&reader).await;
    assert_eq!(messages.len(), 18);
    assert!(
        matches!(&messages[0], Message::Text(t) if t.as_str() == r#"{"meta":"first text frame"}"#)
    );
    assert!(matches!(&messages[1], Message::Binary(b) if b.len() == 64 * 1024));
    let bytes: Vec<u8> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Binary(b) => Some(b.to_vec()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(bytes, data);
}

#[tokio::test]
async fn small_buffer_back_pressures_a_concurrent_writer() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel_sized(Some(2)).await;
    let data = pattern(4 * 1024 * 1024 + 17);
    let chunks: Vec<Message> = data
        .chunks(64 * 1024)
        .map(|c| Message::binary(c.to_vec()))
        .collect();
    let (read, ()) = tokio::join!(
        client.read_channel_bytes(&reader),
        client.write_channel(&writer, chunks)
    );
    assert_eq!(read.0, data);
    assert!(read.1.is_empty());
}

#[tokio::test]
async fn writer_loss_is_end_of_stream_for_the_reader() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel().await;
    let mut w = client.open_channel(&writer).await.unwrap();
    w.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    drop(w); // no Close frame
    let (bytes, texts) = client.read_channel_bytes(&reader).await;
    assert_eq!(bytes, [1, 2, 3]);
    assert!(texts.is_empty());
}

#[tokio::test]
async fn reader_gets_a_close_without_code() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel().await;
    client
        .write_channel(&writer, vec![Message::binary(vec![9])])
        .await;
    let mut r = client.open_channel(&reader).await.unwrap();
    assert_eq!(r.next().await.unwrap().unwrap(), Message::binary(vec![9]));
    assert_eq!(r.next().await.unwrap().unwrap(), Message::Close(None));
}

#[tokio::test]
async fn bad_key_or_unknown_id_is_404_and_each_end_opens_once() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel().await;

    let mut wrong_key = reader.clone();
    wrong_key.access_key = uuid::Uuid::new_v4().to_string();
    let mut unknown = reader.clone();
    unknown.channel_id = uuid::Uuid::new_v4().to_string();
    for bad in [wrong_key, unknown] {
        match client.open_channel(&bad).await {
            Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), StatusCode::NOT_FOUND),
            other => panic!("expected 404, got {other:?}"),
        }
    }
    let bad_path = format!("{}/nope", engine.url());
    match tokio_tungstenite::connect_async(bad_path.as_str()).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), StatusCode::NOT_FOUND),
        other => panic!("expected 404, got {other:?}"),
    }

    let mut first = client.open_channel(&reader).await.unwrap();
    let mut second = client.open_channel(&reader).await.expect("upgraded");
    let next = tokio::time::timeout(WAIT, second.next()).await.unwrap();
    assert!(
        matches!(next, Some(Ok(Message::Close(_))) | None | Some(Err(_))),
        "{next:?}"
    );

    client
        .write_channel(&writer, vec![Message::text("hi")])
        .await;
    assert_eq!(first.next().await.unwrap().unwrap(), Message::text("hi"));
    // The writer end is used up too.
    let mut again = client.open_channel(&writer).await.unwrap();
    let next = tokio::time::timeout(WAIT, again.next()).await.unwrap();
    assert!(
        matches!(next, Some(Ok(Message::Close(_))) | None | Some(Err(_))),
        "{next:?}"
    );
}

#[tokio::test]
async fn reader_going_away_drops_the_writer() {
    let engine = TestEngine::start().await;
    let client = engine.client().await;
    let (writer, reader) = client.create_channel_sized(Some(1)).await;
    let r = client.open_channel(&reader).await.unwrap();
    drop(r);
    let mut w = client.open_channel(&writer).await.unwrap();
    // Keep writing until the engine drops the writer socket.
    let dropped = tokio::time::timeout(Duration::from_secs(10), async {
        for _ in 0..10_000 {
            if w.send(Message::binary(vec![0u8; 64 * 1024])).await.is_err() {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(
        dropped,
        "writer socket should be dropped once the reader is gone"
    );
}
