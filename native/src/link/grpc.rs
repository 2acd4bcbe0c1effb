//! One replica on another host: the contract's `Embed` call over gRPC (tonic, HTTP/2), the
//! request and answer passed through as the bytes `wire` encodes and reads; the link secret
//! sent with each call where one is set (`contract/secret.py`).

use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use super::socket::{Failure, UNAVAILABLE};

/// the method's path (`contract.EMBED_METHOD`)
const EMBED: &str = "/embedserve.v1.Embedder/Embed";
/// the metadata key of the link secret (`contract.secret.LINK_SECRET_KEY`)
const SECRET_KEY: &str = "x-embedserve-link-secret";
/// the largest answer read and request sent (the Python side's channel options)
const MAX_ANSWER_BYTES: usize = 256 << 20;
const MAX_REQUEST_BYTES: usize = 64 << 20;

/// A serialized message passed through as it is.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// A replica at `HOST:PORT`, its channel made at the first call (inside Ivy's runtime) and
/// reconnecting by itself.
pub struct Remote {
    pub address: String,
    secret: Option<MetadataValue<tonic::metadata::Ascii>>,
    channel: OnceLock<Channel>,
}

impl Remote {
    pub fn new(address: &str, secret: Option<&str>) -> Result<Self, String> {
        let secret = match secret {
            Some(s) => Some(
                s.parse()
                    .map_err(|_| "the link secret is not ASCII".to_owned())?,
            ),
            None => None,
        };
        Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("{address}: {e}"))?;
        Ok(Remote {
            address: address.to_owned(),
            secret,
            channel: OnceLock::new(),
        })
    }

    fn channel(&self) -> Channel {
        self.channel
            .get_or_init(|| {
                Endpoint::from_shared(format!("http://{}", self.address))
                    .expect("checked in new()")
                    .connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .connect_lazy()
            })
            .clone()
    }

    /// The serialized answer to the serialized `request`, or why not (gRPC's status).
    pub async fn call(&self, request: &[u8]) -> Result<Vec<u8>, Failure> {
        let mut client = tonic::client::Grpc::new(self.channel())
            .max_decoding_message_size(MAX_ANSWER_BYTES)
            .max_encoding_message_size(MAX_REQUEST_BYTES);
        client.ready().await.map_err(|e| Failure {
            code: UNAVAILABLE,
            message: format!("{}: {e}", self.address),
        })?;
        let mut call = tonic::Request::new(request.to_vec());
        if let Some(secret) = &self.secret {
            call.metadata_mut().insert(SECRET_KEY, secret.clone());
        }
        let path = hyper::http::uri::PathAndQuery::from_static(EMBED);
        match client.unary(call, path, Raw).await {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => Err(Failure {
                code: status.code() as i32 as u8,
                message: status.message().to_owned(),
            }),
        }
    }
}
