//! `#[serde(with = "crate::bytes")]` for the `Vec<u8>` fields that carry terminal output.
//!
//! serde serializes a plain `Vec<u8>` as a sequence, one `u8` at a time; postcard writes such a
//! sequence as a varint length followed by the bytes, and reads it back with one visitor call
//! per byte. Serialized as serde *bytes*, postcard writes exactly the same thing (a varint
//! length, then the bytes), so peers are compatible either way, but both ends copy the data in
//! one piece. JSON (the tests' debug output) keeps the array of numbers.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Serializer;

pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(Bytes)
}

struct Bytes;

impl<'de> Visitor<'de> for Bytes {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("bytes")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        // A self-describing format that wrote a sequence; the length hint is not trusted for
        // more than a small reservation.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(b) = seq.next_element()? {
            out.push(b);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Plain {
        a: u8,
        data: Vec<u8>,
        z: u64,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct AsBytes {
        a: u8,
        #[serde(with = "crate::bytes")]
        data: Vec<u8>,
        z: u64,
    }

    /// The same postcard bytes as a plain `Vec<u8>`, both ways, for the lengths where the
    /// varint prefix changes size.
    #[test]
    fn postcard_encoding_is_that_of_a_plain_vec() {
        for n in [0usize, 1, 127, 128, 16_383, 16_384, 300_000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let plain = postcard::to_stdvec(&Plain {
                a: 9,
                data: data.clone(),
                z: 1 << 40,
            })
            .unwrap();
            let bytes = postcard::to_stdvec(&AsBytes {
                a: 9,
                data: data.clone(),
                z: 1 << 40,
            })
            .unwrap();
            assert_eq!(plain, bytes, "n = {n}");
            let back: AsBytes = postcard::from_bytes(&plain).unwrap();
            assert_eq!(back.data, data);
            let back: Plain = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back.data, data);
        }
    }

    #[test]
    fn a_length_past_the_input_is_an_error() {
        // Announces 200 bytes and carries 3.
        let err = postcard::from_bytes::<AsBytes>(&[1, 0xc8, 0x01, 1, 2, 3]).unwrap_err();
        assert!(
            matches!(err, postcard::Error::DeserializeUnexpectedEnd),
            "{err:?}"
        );
    }

    #[test]
    fn json_keeps_an_array_of_numbers() {
        let v = AsBytes {
            a: 1,
            data: vec![1, 2, 255],
            z: 2,
        };
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(text, r#"{"a":1,"data":[1,2,255],"z":2}"#);
        assert_eq!(serde_json::from_str::<AsBytes>(&text).unwrap(), v);
    }
}
