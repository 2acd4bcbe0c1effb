//! The contract's two messages as this side reads and writes them (`contract/embedserve.proto`,
//! the fields a request answered by Ivy uses; the Python side's codec is `contract/codec.py`):
//! a part's packed ids out, its pooled rows or sparse vectors back.

use prost::Message;

use crate::tulip::{Packed, Rows, SparseRows};

/// `EmbedRequest`'s fields Ivy sets (the rest keep their proto3 defaults).
#[derive(Clone, PartialEq, Message)]
pub struct EmbedRequest {
    /// every sequence back to back, little-endian int32
    #[prost(bytes = "vec", tag = "1")]
    pub input_ids: Vec<u8>,
    #[prost(uint32, repeated, tag = "2")]
    pub seqlens: Vec<u32>,
    /// the pooled float32 rows as the model gives them: Ivy applies the head
    #[prost(bool, tag = "8")]
    pub raw: bool,
    #[prost(string, tag = "10")]
    pub request_id: String,
    #[prost(string, repeated, tag = "11")]
    pub outputs: Vec<String>,
    /// 0 interactive, 1 bulk (`core/lanes.py`)
    #[prost(uint32, tag = "14")]
    pub lane: u32,
}

/// `EmbedResponse`'s fields of a dense or a sparse answer.
#[derive(Clone, PartialEq, Message)]
pub struct EmbedResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub embeddings: Vec<u8>,
    #[prost(uint32, repeated, tag = "2")]
    pub shape: Vec<u32>,
    #[prost(string, tag = "3")]
    pub dtype: String,
    #[prost(uint32, repeated, tag = "4")]
    pub sparse_counts: Vec<u32>,
    #[prost(bytes = "vec", tag = "5")]
    pub sparse_indices: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    pub sparse_values: Vec<u8>,
    #[prost(double, tag = "10")]
    pub queue_seconds: f64,
    #[prost(double, tag = "11")]
    pub inference_seconds: f64,
}

/// What a part asks of a replica: its pooled rows, or its sparse vectors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Asked {
    Rows,
    Sparse,
}

/// The serialized request for `packed`'s sequences (all of type 0: a text alone each).
pub fn request(packed: &Packed, asked: Asked, bulk: bool, request_id: &str) -> Vec<u8> {
    let seqlens = packed
        .cu_seqlens
        .windows(2)
        .map(|w| (w[1] - w[0]) as u32)
        .collect();
    let message = EmbedRequest {
        input_ids: packed.ids.iter().flat_map(|i| i.to_le_bytes()).collect(),
        seqlens,
        raw: asked == Asked::Rows,
        request_id: request_id.to_owned(),
        outputs: match asked {
            Asked::Rows => Vec::new(),
            Asked::Sparse => vec!["sparse".to_owned()],
        },
        lane: u32::from(bulk),
    };
    message.encode_to_vec()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The rows of an answer to a part of `seqs` sequences; an error when it does not fit its
/// request (a server bug or another version: `codec.WireError`'s).
pub fn rows(payload: &[u8], seqs: usize) -> Result<Rows, String> {
    let answer = EmbedResponse::decode(payload).map_err(|e| format!("replica answer: {e}"))?;
    let &[num_rows, width] = answer.shape.as_slice() else {
        return Err(format!("replica answered shape {:?}", answer.shape));
    };
    let (num_rows, width) = (num_rows as usize, width as usize);
    if answer.dtype != "float32"
        || num_rows != seqs
        || answer.embeddings.len() != num_rows * width * 4
    {
        return Err(format!(
            "replica answered {} bytes of {} shape {:?} for {seqs} rows",
            answer.embeddings.len(),
            answer.dtype,
            answer.shape
        ));
    }
    Ok(Rows {
        values: floats(&answer.embeddings),
        width,
        queue: answer.queue_seconds,
        inference: answer.inference_seconds,
    })
}

/// The sparse vectors of an answer to a part of `seqs` sequences (checked as `rows`).
pub fn sparse_rows(payload: &[u8], seqs: usize) -> Result<SparseRows, String> {
    let answer = EmbedResponse::decode(payload).map_err(|e| format!("replica answer: {e}"))?;
    let entries: usize = answer.sparse_counts.iter().map(|&c| c as usize).sum();
    if answer.sparse_counts.len() != seqs
        || answer.sparse_indices.len() != entries * 4
        || answer.sparse_values.len() != entries * 4
    {
        return Err(format!(
            "replica answered {} sparse vectors of {} entries for {seqs} rows",
            answer.sparse_counts.len(),
            entries
        ));
    }
    let mut offsets = Vec::with_capacity(seqs + 1);
    offsets.push(0i64);
    for &count in &answer.sparse_counts {
        offsets.push(offsets[offsets.len() - 1] + i64::from(count));
    }
    let indices = answer
        .sparse_indices
        .chunks_exact(4)
        .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    Ok(SparseRows {
        offsets,
        indices,
        values: floats(&answer.sparse_values),
        queue: answer.queue_seconds,
        inference: answer.inference_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed() -> Packed {
        let mut packed = Packed::new();
        packed.push(&[101, 7, 102]);
        packed.push(&[101, 102]);
        packed
    }

    #[test]
    fn a_request_carries_the_packed_ids_and_the_lane() {
        let bytes = request(&packed(), Asked::Rows, true, "abc");
        let read = EmbedRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(read.seqlens, [3, 2]);
        assert_eq!(read.input_ids.len(), 20);
        assert_eq!(
            i32::from_le_bytes(read.input_ids[4..8].try_into().unwrap()),
            7
        );
        assert!(read.raw && read.outputs.is_empty() && read.lane == 1);
        let sparse = EmbedRequest::decode(request(&packed(), Asked::Sparse, false, "").as_slice());
        let sparse = sparse.unwrap();
        assert!(!sparse.raw && sparse.outputs == ["sparse"] && sparse.lane == 0);
    }

    #[test]
    fn an_answer_that_does_not_fit_its_request_is_an_error() {
        let answer = EmbedResponse {
            embeddings: [1.0f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            shape: vec![2, 2],
            dtype: "float32".into(),
            queue_seconds: 0.5,
            ..EmbedResponse::default()
        }
        .encode_to_vec();
        let read = rows(&answer, 2).unwrap();
        assert_eq!(
            (read.values, read.width, read.queue),
            (vec![1.0, 2.0, 3.0, 4.0], 2, 0.5)
        );
        assert!(rows(&answer, 3).is_err());
        assert!(rows(b"\xff\xff", 2).is_err());
        let sparse = EmbedResponse {
            sparse_counts: vec![2, 0],
            sparse_indices: [5i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect(),
            sparse_values: [0.5f32, 1.5].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ..EmbedResponse::default()
        }
        .encode_to_vec();
        let read = sparse_rows(&sparse, 2).unwrap();
        assert_eq!((read.offsets, read.indices), (vec![0, 2, 2], vec![5, 9]));
        assert!(sparse_rows(&sparse, 1).is_err());
    }
}
