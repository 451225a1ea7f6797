//! HTTP/2 `:authority` rewriting for the registration socket.
//!
//! The kubelet's plugin manager dials the registration socket by its bare
//! filesystem path, so grpc-go sends the percent-encoded path (for example
//! `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock`) as
//! the HTTP/2 `:authority` pseudo-header. `h2`, the HTTP/2 layer under tonic,
//! refuses an authority containing `%` and resets the stream with
//! `PROTOCOL_ERROR`: a stock tonic server can never be registered.
//!
//! [`AuthorityRewriteStream`] fixes this below h2, on the byte stream. It
//! follows the client's HTTP/2 frames, decodes every header block with the
//! connection's HPACK state, replaces `:authority` with `localhost` and hands
//! h2 an equivalent block made only of literals "without indexing", so h2's
//! own HPACK table never depends on ours. All other frames, and the whole
//! server-to-client direction, pass through untouched. The SDK wraps every
//! registration connection in it, so applications need no patched `h2`.
//!
//! Only the registration socket needs this: the kubelet dials the DRA service
//! socket as `unix:<path>`, for which grpc-go sends `localhost` itself.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::{fmt, io};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface that opens every HTTP/2 connection.
pub(crate) const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;

const FRAME_HEADERS: u8 = 0x1;
const FRAME_PUSH_PROMISE: u8 = 0x5;
const FRAME_CONTINUATION: u8 = 0x9;

const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Largest frame payload we emit: h2's default `SETTINGS_MAX_FRAME_SIZE`,
/// which the registration server never raises.
const MAX_OUTPUT_FRAME_LEN: usize = 16_384;

/// The HPACK dynamic-table limit the client may use: the HTTP/2 default of
/// `SETTINGS_HEADER_TABLE_SIZE`, which tonic's server never changes.
const HPACK_TABLE_SIZE: usize = 4_096;

/// Upper bound on one encoded header block (all HEADERS and CONTINUATION
/// payloads of a request together). Well above hyper's 16 KiB header-list
/// default, so h2 rather than this shim decides what is "too large" in the
/// normal range; it only bounds our own buffering.
const MAX_HEADER_BLOCK_LEN: usize = 64 * 1024;

/// Upper bound on one decoded header list, sized as RFC 9113 §6.5.2 does
/// (name + value + 32 per field). Bounds memory against blocks that expand
/// through repeated references to large dynamic-table entries.
const MAX_HEADER_LIST_SIZE: usize = 64 * 1024;

/// The authority h2 sees instead of whatever the client sent.
const REWRITTEN_AUTHORITY: &[u8] = b"localhost";

/// Decoded header fields, (name, value), in block order.
type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// Why a registration connection had to be closed by the rewriter.
///
/// It reaches h2 (and tonic's connection task) as the source of an
/// [`io::Error`] of kind [`io::ErrorKind::InvalidData`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// The HPACK header block could not be decoded.
    #[error("undecodable HPACK header block on HTTP/2 stream {stream_id}: {reason}")]
    Hpack {
        /// Stream the block belongs to.
        stream_id: u32,
        /// What the HPACK decoder rejected.
        reason: String,
    },
    /// The encoded header block grew beyond 64 KiB.
    #[error(
        "HTTP/2 header block on stream {stream_id} exceeds {limit} bytes",
        limit = MAX_HEADER_BLOCK_LEN
    )]
    HeaderBlockTooLarge {
        /// Stream the block belongs to.
        stream_id: u32,
    },
    /// The decoded header list grew beyond 64 KiB (RFC 9113 §6.5.2 sizing).
    #[error(
        "decoded HTTP/2 header list on stream {stream_id} exceeds {limit} bytes",
        limit = MAX_HEADER_LIST_SIZE
    )]
    HeaderListTooLarge {
        /// Stream the list belongs to.
        stream_id: u32,
    },
    /// A header block was interrupted by a frame other than its CONTINUATION.
    #[error(
        "expected a CONTINUATION frame for stream {stream_id}, got frame type {frame_type:#x} on stream {frame_stream_id}"
    )]
    ExpectedContinuation {
        /// Stream whose header block is unfinished.
        stream_id: u32,
        /// Type of the frame that arrived instead.
        frame_type: u8,
        /// Stream of the frame that arrived instead.
        frame_stream_id: u32,
    },
    /// A CONTINUATION frame arrived without an unfinished header block.
    #[error("unexpected CONTINUATION frame on stream {stream_id}")]
    UnexpectedContinuation {
        /// Stream of the stray frame.
        stream_id: u32,
    },
    /// A client sent PUSH_PROMISE, which only servers may send.
    #[error("client sent a PUSH_PROMISE frame on stream {stream_id}")]
    PushPromiseFromClient {
        /// Stream of the frame.
        stream_id: u32,
    },
    /// The padding or priority fields do not fit in the HEADERS payload.
    #[error("HEADERS frame on stream {stream_id} is shorter than its padding and priority fields")]
    MalformedHeaders {
        /// Stream of the frame.
        stream_id: u32,
    },
}

impl From<AuthorityError> for io::Error {
    fn from(error: AuthorityError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }
}

/// A server-side connection whose incoming HTTP/2 `:authority` is rewritten to
/// `localhost` before the HTTP/2 server parses it.
///
/// Wrap each accepted connection of the registration socket in it and give
/// the stream of wrapped connections to tonic's
/// `serve_with_incoming_shutdown`; [`Connected`] is forwarded, so request
/// extensions still carry the peer credentials of the Unix socket. The SDK's
/// own registration server does exactly that, so most users never touch
/// this type.
///
/// A connection that does not start with the HTTP/2 preface is passed through
/// unchanged (h2 rejects it). A header block that cannot be decoded fails the
/// connection with an [`io::Error`] whose source is an [`AuthorityError`].
///
/// # Example
///
/// ```no_run
/// use dra_sdk::advanced::AuthorityRewriteStream;
/// use futures::TryStreamExt;
/// use tokio_stream::wrappers::UnixListenerStream;
///
/// # async fn demo() -> std::io::Result<()> {
/// let listener = tokio::net::UnixListener::bind("/tmp/example-reg.sock")?;
/// // Feed this to `tonic::transport::Server::serve_with_incoming_shutdown`.
/// let _incoming = UnixListenerStream::new(listener).map_ok(AuthorityRewriteStream::new);
/// # Ok(())
/// # }
/// ```
pub struct AuthorityRewriteStream<S> {
    inner: S,
    rewriter: Rewriter,
    scratch: Box<[u8]>,
    failure: Option<AuthorityError>,
}

impl<S> AuthorityRewriteStream<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(REWRITTEN_AUTHORITY.to_vec()),
            scratch: vec![0; 8 * 1024].into_boxed_slice(),
            failure: None,
        }
    }

    /// Like [`AuthorityRewriteStream::new`], but writes `authority` instead of `localhost`.
    ///
    /// A kubelet stand-in uses it the other way round, on its client side, to send the
    /// percent-encoded socket path the real kubelet sends (which `http::Uri`, and so tonic's
    /// client, refuses to build).
    pub fn with_authority(inner: S, authority: impl Into<Vec<u8>>) -> Self {
        let mut stream = Self::new(inner);
        stream.rewriter.authority = authority.into();
        stream
    }
}

impl<S: fmt::Debug> fmt::Debug for AuthorityRewriteStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthorityRewriteStream")
            .field("inner", &self.inner)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<S: Connected> Connected for AuthorityRewriteStream<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityRewriteStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(failure) = &this.failure {
                return Poll::Ready(Err(failure.clone().into()));
            }
            if this.rewriter.has_output() || buf.remaining() == 0 {
                this.rewriter.take_output(buf);
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let received = read.filled();
            if received.is_empty() {
                if this.rewriter.is_mid_frame() {
                    tracing::debug!(
                        "registration connection closed in the middle of an HTTP/2 frame"
                    );
                }
                return Poll::Ready(Ok(()));
            }
            if let Err(error) = this.rewriter.feed(received) {
                tracing::warn!(%error, "closing registration connection: cannot rewrite its HTTP/2 :authority");
                this.failure = Some(error.clone());
                return Poll::Ready(Err(error.into()));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityRewriteStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Where the rewriter is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Inside the connection preface; `matched` bytes of it seen so far.
    Preface { matched: usize },
    /// At a frame boundary, or waiting for the rest of a header frame.
    Frames,
    /// Forwarding the payload of a frame that is not rewritten.
    Forward { remaining: usize },
    /// Not HTTP/2 with prior knowledge: forward everything, h2 refuses it.
    Passthrough,
}

/// A header block whose END_HEADERS has not arrived yet.
struct PendingBlock {
    stream_id: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    fn parse(bytes: &[u8]) -> Option<Self> {
        let header: &[u8; FRAME_HEADER_LEN] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            len: usize::from(header[0]) << 16
                | usize::from(header[1]) << 8
                | usize::from(header[2]),
            kind: header[3],
            flags: header[4],
            stream_id: u32::from_be_bytes([header[5], header[6], header[7], header[8]])
                & 0x7fff_ffff,
        })
    }
}

/// The sans-I/O core: bytes from the client go in through [`Rewriter::feed`],
/// the rewritten byte stream for h2 comes out of `output`.
struct Rewriter {
    phase: Phase,
    input: BytesMut,
    output: BytesMut,
    /// HPACK decoder carrying the connection's dynamic table, which the
    /// client's encoder assumes when it refers back to earlier headers.
    decoder: loona_hpack::Decoder<'static>,
    block: Option<PendingBlock>,
    /// What every `:authority` is replaced with.
    authority: Vec<u8>,
}

impl Rewriter {
    fn new(authority: Vec<u8>) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        // Refuse size updates beyond what the server ever allowed the client.
        decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
        Self {
            phase: Phase::Preface { matched: 0 },
            input: BytesMut::new(),
            output: BytesMut::new(),
            decoder,
            block: None,
            authority,
        }
    }

    fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    fn take_output(&mut self, buf: &mut ReadBuf<'_>) {
        let n = self.output.len().min(buf.remaining());
        buf.put_slice(&self.output[..n]);
        self.output.advance(n);
    }

    /// Whether unconsumed bytes of a frame are buffered.
    fn is_mid_frame(&self) -> bool {
        !self.input.is_empty()
            || self.block.is_some()
            || matches!(self.phase, Phase::Forward { .. })
    }

    /// Consumes bytes from the client and appends whatever can already be
    /// forwarded to the output.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), AuthorityError> {
        self.input.extend_from_slice(bytes);
        self.process()
    }

    fn process(&mut self) -> Result<(), AuthorityError> {
        loop {
            match self.phase {
                Phase::Preface { matched } => {
                    let expected = &PREFACE[matched..];
                    let n = expected.len().min(self.input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    if self.input[..n] != expected[..n] {
                        self.phase = Phase::Passthrough;
                        continue;
                    }
                    self.forward(n);
                    self.phase = if matched + n == PREFACE.len() {
                        Phase::Frames
                    } else {
                        Phase::Preface {
                            matched: matched + n,
                        }
                    };
                }
                Phase::Passthrough => {
                    self.forward(self.input.len());
                    return Ok(());
                }
                Phase::Forward { remaining: 0 } => self.phase = Phase::Frames,
                Phase::Forward { remaining } => {
                    let n = remaining.min(self.input.len());
                    if n == 0 {
                        return Ok(());
                    }
                    self.forward(n);
                    self.phase = if n == remaining {
                        Phase::Frames
                    } else {
                        Phase::Forward {
                            remaining: remaining - n,
                        }
                    };
                }
                Phase::Frames => {
                    let Some(header) = FrameHeader::parse(&self.input) else {
                        return Ok(());
                    };
                    if !self.is_header_frame(&header)? {
                        self.forward(FRAME_HEADER_LEN);
                        self.phase = Phase::Forward {
                            remaining: header.len,
                        };
                        continue;
                    }
                    let frame_len = FRAME_HEADER_LEN + header.len;
                    if self.input.len() < frame_len {
                        return Ok(());
                    }
                    let frame = self.input.split_to(frame_len);
                    self.on_header_frame(&header, &frame[FRAME_HEADER_LEN..])?;
                }
            }
        }
    }

    fn forward(&mut self, n: usize) {
        let bytes = self.input.split_to(n);
        self.output.extend_from_slice(&bytes);
    }

    /// Decides whether a frame carries (part of) a header block and checks,
    /// before its payload is buffered, that it may arrive now.
    fn is_header_frame(&self, header: &FrameHeader) -> Result<bool, AuthorityError> {
        if let Some(block) = &self.block {
            if header.kind != FRAME_CONTINUATION || header.stream_id != block.stream_id {
                return Err(AuthorityError::ExpectedContinuation {
                    stream_id: block.stream_id,
                    frame_type: header.kind,
                    frame_stream_id: header.stream_id,
                });
            }
            if block.fragment.len().saturating_add(header.len) > MAX_HEADER_BLOCK_LEN {
                return Err(AuthorityError::HeaderBlockTooLarge {
                    stream_id: block.stream_id,
                });
            }
            return Ok(true);
        }
        match header.kind {
            FRAME_HEADERS if header.len > MAX_HEADER_BLOCK_LEN => {
                Err(AuthorityError::HeaderBlockTooLarge {
                    stream_id: header.stream_id,
                })
            }
            FRAME_HEADERS => Ok(true),
            FRAME_CONTINUATION => Err(AuthorityError::UnexpectedContinuation {
                stream_id: header.stream_id,
            }),
            // Its header block would feed the HPACK state we cannot see
            // past; h2 would reject it anyway.
            FRAME_PUSH_PROMISE => Err(AuthorityError::PushPromiseFromClient {
                stream_id: header.stream_id,
            }),
            _ => Ok(false),
        }
    }

    fn on_header_frame(
        &mut self,
        header: &FrameHeader,
        payload: &[u8],
    ) -> Result<(), AuthorityError> {
        if let Some(block) = self.block.as_mut() {
            block.fragment.extend_from_slice(payload);
        } else {
            let fragment = headers_fragment(header, payload)?;
            self.block = Some(PendingBlock {
                stream_id: header.stream_id,
                end_stream: header.flags & FLAG_END_STREAM != 0,
                fragment: fragment.to_vec(),
            });
        }
        if header.flags & FLAG_END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let headers = self.decode(block.stream_id, &block.fragment)?;
        let encoded = encode_unindexed(&headers);
        write_header_frames(
            &mut self.output,
            block.stream_id,
            block.end_stream,
            &encoded,
        );
        Ok(())
    }

    /// Decodes a complete header block (dynamic-table size updates included,
    /// which only concern our decoder) and swaps in the new authority.
    fn decode(&mut self, stream_id: u32, fragment: &[u8]) -> Result<HeaderList, AuthorityError> {
        let mut headers = Vec::new();
        let mut list_size = 0usize;
        let decoded = self.decoder.decode_with_cb(fragment, |name, value| {
            list_size = list_size.saturating_add(name.len() + value.len() + 32);
            if list_size <= MAX_HEADER_LIST_SIZE {
                headers.push((name.into_owned(), value.into_owned()));
            }
        });
        if let Err(error) = decoded {
            return Err(AuthorityError::Hpack {
                stream_id,
                reason: error.to_string(),
            });
        }
        if list_size > MAX_HEADER_LIST_SIZE {
            return Err(AuthorityError::HeaderListTooLarge { stream_id });
        }
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority" {
                tracing::debug!(
                    stream_id,
                    authority = %String::from_utf8_lossy(value),
                    replacement = %String::from_utf8_lossy(&self.authority),
                    "rewriting HTTP/2 :authority of a registration request"
                );
                value.clone_from(&self.authority);
            }
        }
        Ok(headers)
    }
}

/// The header block fragment of a HEADERS payload, without padding and
/// priority fields (priority is advisory, and h2 ignores it).
fn headers_fragment<'a>(
    header: &FrameHeader,
    payload: &'a [u8],
) -> Result<&'a [u8], AuthorityError> {
    let malformed = || AuthorityError::MalformedHeaders {
        stream_id: header.stream_id,
    };
    let mut start = 0;
    let mut end = payload.len();
    if header.flags & FLAG_PADDED != 0 {
        let pad_len = usize::from(*payload.first().ok_or_else(malformed)?);
        start = 1;
        end = end.checked_sub(pad_len).ok_or_else(malformed)?;
    }
    if header.flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or_else(malformed)
}

/// Encodes every field as "literal header field without indexing — new name"
/// (RFC 7541 §6.2.2) with raw strings: the block means the same to any
/// decoder, whatever its dynamic table holds, and leaves that table alone.
fn encode_unindexed(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let capacity = headers.iter().map(|(n, v)| n.len() + v.len() + 11).sum();
    let mut out = Vec::with_capacity(capacity);
    for (name, value) in headers {
        out.push(0x00);
        encode_string(name, &mut out);
        encode_string(value, &mut out);
    }
    out
}

fn encode_string(bytes: &[u8], out: &mut Vec<u8>) {
    // Huffman bit clear, 7-bit length prefix (RFC 7541 §5.1, §5.2).
    encode_integer(bytes.len(), 7, 0x00, out);
    out.extend_from_slice(bytes);
}

fn encode_integer(mut value: usize, prefix_bits: u8, first_byte_flags: u8, out: &mut Vec<u8>) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        // Fits in the prefix; the cast cannot truncate.
        out.push(first_byte_flags | value as u8);
        return;
    }
    out.push(first_byte_flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Emits a header block as one HEADERS frame plus as many CONTINUATION frames
/// as h2's default maximum frame size requires.
fn write_header_frames(out: &mut BytesMut, stream_id: u32, end_stream: bool, block: &[u8]) {
    let frame_count = block.len().div_ceil(MAX_OUTPUT_FRAME_LEN).max(1);
    for index in 0..frame_count {
        let start = (index * MAX_OUTPUT_FRAME_LEN).min(block.len());
        let end = ((index + 1) * MAX_OUTPUT_FRAME_LEN).min(block.len());
        let chunk = &block[start..end];
        let (kind, mut flags) = if index == 0 {
            (FRAME_HEADERS, if end_stream { FLAG_END_STREAM } else { 0 })
        } else {
            (FRAME_CONTINUATION, 0)
        };
        if index + 1 == frame_count {
            flags |= FLAG_END_HEADERS;
        }
        // `chunk.len()` ≤ 16384 fits the 24-bit length field.
        let len = chunk.len() as u32;
        out.put_slice(&len.to_be_bytes()[1..]);
        out.put_u8(kind);
        out.put_u8(flags);
        out.put_u32(stream_id);
        out.put_slice(chunk);
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A tiny HTTP/2 frame reader for tests that look at raw connections.

    /// One HTTP/2 frame.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Frame {
        pub(crate) kind: u8,
        pub(crate) flags: u8,
        pub(crate) stream_id: u32,
        pub(crate) payload: Vec<u8>,
    }

    pub(crate) const DATA: u8 = 0x0;
    pub(crate) const HEADERS: u8 = 0x1;
    pub(crate) const RST_STREAM: u8 = 0x3;
    pub(crate) const SETTINGS: u8 = 0x4;
    pub(crate) const PING: u8 = 0x6;
    pub(crate) const WINDOW_UPDATE: u8 = 0x8;
    pub(crate) const CONTINUATION: u8 = 0x9;

    pub(crate) const END_STREAM: u8 = 0x1;
    pub(crate) const END_HEADERS: u8 = 0x4;
    pub(crate) const PADDED: u8 = 0x8;
    pub(crate) const PRIORITY: u8 = 0x20;

    pub(crate) use super::PREFACE;

    /// Splits `bytes` into complete frames; returns them and the number of
    /// trailing bytes that do not form a complete frame.
    pub(crate) fn parse_frames(mut bytes: &[u8]) -> (Vec<Frame>, usize) {
        let mut frames = Vec::new();
        while bytes.len() >= 9 {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            if bytes.len() < 9 + len {
                break;
            }
            frames.push(Frame {
                kind: bytes[3],
                flags: bytes[4],
                stream_id: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]])
                    & 0x7fff_ffff,
                payload: bytes[9..9 + len].to_vec(),
            });
            bytes = &bytes[9 + len..];
        }
        (frames, bytes.len())
    }

    /// Serializes one frame.
    pub(crate) fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap();
        assert!(len < 1 << 24, "frame payload too long");
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// A header block reassembled from HEADERS + CONTINUATION frames.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct HeaderBlock {
        pub(crate) stream_id: u32,
        /// Flags of the HEADERS frame.
        pub(crate) flags: u8,
        pub(crate) fragment: Vec<u8>,
    }

    /// What one direction of a connection carried, frame by frame, with
    /// header blocks reassembled (padding and priority fields stripped).
    #[derive(Debug, Default)]
    pub(crate) struct Conversation {
        pub(crate) blocks: Vec<HeaderBlock>,
        /// Every frame that is not HEADERS or CONTINUATION, in order.
        pub(crate) others: Vec<Frame>,
    }

    /// Groups frames into header blocks and other frames.
    pub(crate) fn collect(frames: &[Frame]) -> Conversation {
        let mut conversation = Conversation::default();
        let mut open: Option<HeaderBlock> = None;
        for frame in frames {
            match frame.kind {
                HEADERS => {
                    assert!(open.is_none(), "HEADERS inside an open header block");
                    let mut payload = &frame.payload[..];
                    if frame.flags & PADDED != 0 {
                        let pad = usize::from(payload[0]);
                        payload = &payload[1..payload.len() - pad];
                    }
                    if frame.flags & PRIORITY != 0 {
                        payload = &payload[5..];
                    }
                    let block = HeaderBlock {
                        stream_id: frame.stream_id,
                        flags: frame.flags,
                        fragment: payload.to_vec(),
                    };
                    if frame.flags & END_HEADERS != 0 {
                        conversation.blocks.push(block);
                    } else {
                        open = Some(block);
                    }
                }
                CONTINUATION => {
                    let mut block = open.take().expect("CONTINUATION without HEADERS");
                    assert_eq!(block.stream_id, frame.stream_id);
                    block.fragment.extend_from_slice(&frame.payload);
                    if frame.flags & END_HEADERS != 0 {
                        conversation.blocks.push(block);
                    } else {
                        open = Some(block);
                    }
                }
                _ => conversation.others.push(frame.clone()),
            }
        }
        assert!(open.is_none(), "unterminated header block");
        conversation
    }

    /// Decodes header blocks in order with one HPACK decoder, as the peer
    /// would; header names and values as (lossy) strings.
    pub(crate) fn decode_blocks(blocks: &[HeaderBlock]) -> Vec<Vec<(String, String)>> {
        let mut decoder = loona_hpack::Decoder::new();
        blocks
            .iter()
            .map(|block| {
                decoder
                    .decode(&block.fragment)
                    .unwrap()
                    .into_iter()
                    .map(|(n, v)| {
                        (
                            String::from_utf8_lossy(&n).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })
                    .collect()
            })
            .collect()
    }

    /// Looks up a header by name.
    pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use httlib_hpack::Encoder;
    use proptest::prelude::*;

    const FIXTURE: &[u8] = include_bytes!("../../tests/fixtures/kubelet-registration-v1.36.2.h2");

    /// Feeds `chunks` one by one and returns everything the rewriter emits.
    fn rewrite_chunks<'a>(
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Vec<u8>, AuthorityError> {
        let mut rewriter = Rewriter::new(REWRITTEN_AUTHORITY.to_vec());
        let mut out = Vec::new();
        for chunk in chunks {
            rewriter.feed(chunk)?;
            out.extend_from_slice(&rewriter.output.split());
        }
        Ok(out)
    }

    /// Splits `bytes` at the given (unsorted, possibly out-of-range) cut points.
    fn split_at_cuts(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut start = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            chunks.push(bytes[start..cut].to_vec());
            start = cut;
        }
        chunks
    }

    /// Asserts a block only holds "literal without indexing, new name"
    /// fields with raw (non-Huffman) strings, the only form we emit.
    fn assert_only_unindexed_literals(mut block: &[u8]) {
        fn integer(bytes: &mut &[u8], prefix_bits: u32) -> usize {
            let max = (1usize << prefix_bits) - 1;
            let mut value = usize::from(bytes[0]) & max;
            *bytes = &bytes[1..];
            if value < max {
                return value;
            }
            let mut shift = 0;
            loop {
                let byte = bytes[0];
                *bytes = &bytes[1..];
                value += usize::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    return value;
                }
            }
        }
        while !block.is_empty() {
            assert_eq!(
                block[0], 0x00,
                "field is not a new-name literal without indexing"
            );
            block = &block[1..];
            for _ in 0..2 {
                assert_eq!(block[0] & 0x80, 0, "Huffman-coded string in output");
                let len = integer(&mut block, 7);
                block = &block[len..];
            }
        }
    }

    fn pairs(headers: &[(&str, &str)]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubelet_fixture_gets_localhost_authority_on_both_streams() {
        let out = rewrite_chunks([FIXTURE]).unwrap();
        assert_eq!(&out[..24], PREFACE);
        let (frames, rest) = parse_frames(&out[24..]);
        assert_eq!(rest, 0);
        let conversation = collect(&frames);
        assert_eq!(conversation.blocks.len(), 2);
        for block in &conversation.blocks {
            assert_only_unindexed_literals(&block.fragment);
        }
        let headers = decode_blocks(&conversation.blocks);
        let expected = |path: &str, timeout: &str| {
            pairs(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("user-agent", "grpc-go/1.79.3"),
                ("te", "trailers"),
                ("grpc-timeout", timeout),
            ])
        };
        assert_eq!(
            headers[0],
            expected("/pluginregistration.Registration/GetInfo", "999911u")
        );
        assert_eq!(
            headers[1],
            expected(
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                "4999992u"
            )
        );
        // Everything else is forwarded byte for byte.
        let (original, _) = parse_frames(&FIXTURE[24..]);
        let original_others: Vec<_> = original.into_iter().filter(|f| f.kind != HEADERS).collect();
        assert_eq!(conversation.others, original_others);
    }

    #[test]
    fn kubelet_fixture_byte_by_byte() {
        let whole = rewrite_chunks([FIXTURE]).unwrap();
        let bytewise = rewrite_chunks(FIXTURE.chunks(1)).unwrap();
        assert_eq!(whole, bytewise);
    }

    #[test]
    fn large_block_is_split_into_continuation_frames() {
        let big = "x".repeat(40_000);
        let mut encoder = Encoder::default();
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":authority", "%2Ftmp%2Fa.sock"),
            ("big", big.as_str()),
        ] {
            encoder
                .encode(
                    (
                        name.as_bytes().to_vec(),
                        value.as_bytes().to_vec(),
                        Encoder::HUFFMAN_VALUE,
                    ),
                    &mut block,
                )
                .unwrap();
        }
        // The client sends it in two frames (its own split).
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_STREAM, 1, &block[..30_000]));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, &block[30_000..]));
        let out = rewrite_chunks([&input[..]]).unwrap();
        let (frames, _) = parse_frames(&out[24..]);
        assert_eq!(frames.len(), 3);
        assert!(
            frames
                .iter()
                .all(|f| f.payload.len() <= MAX_OUTPUT_FRAME_LEN)
        );
        assert_eq!(frames[0].kind, HEADERS);
        assert_eq!(frames[0].flags, END_STREAM);
        assert_eq!(frames[1].kind, CONTINUATION);
        assert_eq!(frames[1].flags, 0);
        assert_eq!(frames[2].kind, CONTINUATION);
        assert_eq!(frames[2].flags, END_HEADERS);
        let headers = decode_blocks(&collect(&frames).blocks);
        assert_eq!(
            headers[0],
            pairs(&[
                (":method", "POST"),
                (":authority", "localhost"),
                ("big", &big)
            ])
        );
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        let mut block = Vec::new();
        Encoder::default()
            .encode((b":authority".to_vec(), b"%2Fs".to_vec(), 0), &mut block)
            .unwrap();
        let mut payload = vec![3]; // pad length
        payload.extend([0x80, 0, 0, 1, 200]); // exclusive dependency on stream 1, weight
        payload.extend(&block);
        payload.extend([0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 3, &payload));
        let out = rewrite_chunks([&input[..]]).unwrap();
        let (frames, _) = parse_frames(&out[24..]);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].flags, END_HEADERS);
        assert_eq!(
            decode_blocks(&collect(&frames).blocks)[0],
            pairs(&[(":authority", "localhost")])
        );
    }

    #[test]
    fn size_update_applies_to_our_decoder_and_is_not_forwarded() {
        let mut encoder = Encoder::default();
        let mut first = Vec::new();
        encoder
            .encode(
                (b"x-a".to_vec(), b"1".to_vec(), Encoder::WITH_INDEXING),
                &mut first,
            )
            .unwrap();
        // Shrinking to 0 evicts x-a; a later reference to it must fail.
        let mut second = Vec::new();
        encoder.update_max_dynamic_size(0, &mut second).unwrap();
        encoder
            .encode((b":authority".to_vec(), b"a".to_vec(), 0), &mut second)
            .unwrap();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &first));
        input.extend(frame(HEADERS, END_HEADERS, 3, &second));
        let out = rewrite_chunks([&input[..]]).unwrap();
        let (frames, _) = parse_frames(&out[24..]);
        let blocks = collect(&frames).blocks;
        assert_only_unindexed_literals(&blocks[1].fragment);
        assert_eq!(
            decode_blocks(&blocks)[1],
            pairs(&[(":authority", "localhost")])
        );

        let mut stale = input.clone();
        stale.extend(frame(HEADERS, END_HEADERS, 5, &[0x80 | 62]));
        let error = rewrite_chunks([&stale[..]]).unwrap_err();
        assert!(
            matches!(error, AuthorityError::Hpack { stream_id: 5, .. }),
            "{error}"
        );
    }

    #[test]
    fn oversized_size_update_is_rejected() {
        let mut input = PREFACE.to_vec();
        // Size update to 4097 (> SETTINGS_HEADER_TABLE_SIZE), then :method GET.
        let mut block = vec![0x3f, 0xe2, 0x1f];
        block.push(0x82);
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let error = rewrite_chunks([&input[..]]).unwrap_err();
        assert!(
            matches!(error, AuthorityError::Hpack { stream_id: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn framing_violations_fail_the_connection() {
        let with = |frames: &[Vec<u8>]| {
            let mut input = PREFACE.to_vec();
            frames.iter().for_each(|f| input.extend(f));
            rewrite_chunks([&input[..]]).unwrap_err()
        };
        assert_eq!(
            with(&[frame(HEADERS, 0, 1, &[0x82]), frame(DATA, 0, 1, b"")]),
            AuthorityError::ExpectedContinuation {
                stream_id: 1,
                frame_type: DATA,
                frame_stream_id: 1
            }
        );
        assert_eq!(
            with(&[
                frame(HEADERS, 0, 1, &[0x82]),
                frame(CONTINUATION, END_HEADERS, 3, &[0x84])
            ]),
            AuthorityError::ExpectedContinuation {
                stream_id: 1,
                frame_type: CONTINUATION,
                frame_stream_id: 3
            }
        );
        assert_eq!(
            with(&[frame(CONTINUATION, END_HEADERS, 1, &[0x82])]),
            AuthorityError::UnexpectedContinuation { stream_id: 1 }
        );
        assert_eq!(
            with(&[frame(0x5, END_HEADERS, 1, &[0, 0, 0, 2, 0x82])]),
            AuthorityError::PushPromiseFromClient { stream_id: 1 }
        );
        assert_eq!(
            with(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[5, 0x82])]),
            AuthorityError::MalformedHeaders { stream_id: 1 }
        );
        assert_eq!(
            with(&[frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0, 0])]),
            AuthorityError::MalformedHeaders { stream_id: 1 }
        );
        // The limit is checked from the frame header, before any payload.
        let mut input = PREFACE.to_vec();
        input.extend(&frame(HEADERS, END_HEADERS, 1, &vec![0; MAX_HEADER_BLOCK_LEN + 1])[..9]);
        assert_eq!(
            rewrite_chunks([&input[..]]).unwrap_err(),
            AuthorityError::HeaderBlockTooLarge { stream_id: 1 }
        );
    }

    #[test]
    fn header_list_expansion_is_bounded() {
        // One 4000-byte entry in the dynamic table, then a block referring to
        // it 100 times: ~400 KB decoded from 100 bytes.
        let mut block = Vec::new();
        let mut encoder = Encoder::default();
        encoder
            .encode(
                (b"x".to_vec(), vec![b'v'; 4000], Encoder::WITH_INDEXING),
                &mut block,
            )
            .unwrap();
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        input.extend(frame(HEADERS, END_HEADERS, 3, &[0x80 | 62; 100]));
        assert_eq!(
            rewrite_chunks([&input[..]]).unwrap_err(),
            AuthorityError::HeaderListTooLarge { stream_id: 3 }
        );
    }

    #[test]
    fn test_client_uses_huffman_and_the_dynamic_table() {
        // Guards the property test below: its client must really produce the
        // representations that make the rewrite hard.
        let header =
            |n: &str, v: &str, e: Encoding| (n.as_bytes().to_vec(), v.as_bytes().to_vec(), e);
        let indexed = Encoding {
            huffman_name: true,
            huffman_value: true,
            indexing: 1,
            best: true,
        };
        let request = Request {
            size_update: None,
            headers: vec![
                header(":authority", "%2Fa%2Fb.sock", indexed),
                header("x-custom", "value", indexed),
            ],
            end_stream: false,
            padded: None,
            priority: false,
            fragment_cuts: vec![],
            trailing_frame: None,
        };
        let (bytes, _) = client_connection(&[request.clone(), request]);
        let (frames, _) = parse_frames(&bytes[24..]);
        let blocks = collect(&frames).blocks;
        // First block: ":authority" by static name index 1 with a Huffman value.
        assert_eq!(blocks[0].fragment[0], 0x40 | 1);
        assert_ne!(blocks[0].fragment[1] & 0x80, 0);
        // Second block: both fields are dynamic-table references (62, 63).
        assert_eq!(blocks[1].fragment, vec![0x80 | 63, 0x80 | 62]);
        let out = rewrite_chunks([&bytes[..]]).unwrap();
        let (frames, _) = parse_frames(&out[24..]);
        for block in decode_blocks(&collect(&frames).blocks) {
            assert_eq!(
                block,
                pairs(&[(":authority", "localhost"), ("x-custom", "value")])
            );
        }
    }

    #[test]
    fn non_http2_connection_passes_through() {
        let input = b"GET / HTTP/1.1\r\nHost: %2Fsock\r\n\r\n";
        assert_eq!(rewrite_chunks(input.chunks(3)).unwrap(), input.to_vec());
    }

    /// Yields one chunk per read, like a socket that delivers in pieces.
    struct ChunkedReader(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for ChunkedReader {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    self.0.push_front(chunk.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn stream_wrapper_reassembles_split_reads_and_small_buffers() {
        use tokio::io::AsyncReadExt;
        let reader = ChunkedReader(FIXTURE.chunks(7).map(<[u8]>::to_vec).collect());
        let mut stream = AuthorityRewriteStream::new(reader);
        let mut out = Vec::new();
        let mut buf = [0u8; 5];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, rewrite_chunks([FIXTURE]).unwrap());
    }

    #[tokio::test]
    async fn stream_wrapper_keeps_failing_after_an_error() {
        use tokio::io::AsyncReadExt;
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &[0x80 | 70]));
        let mut stream = AuthorityRewriteStream::new(&input[..]);
        let mut out = Vec::new();
        let error = stream.read_to_end(&mut out).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let source = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<AuthorityError>());
        assert!(matches!(
            source,
            Some(AuthorityError::Hpack { stream_id: 1, .. })
        ));
        assert!(stream.read(&mut [0; 8]).await.is_err());
    }

    // ---- property tests -------------------------------------------------

    /// How one header field is HPACK-encoded by the test client.
    #[derive(Debug, Clone, Copy)]
    struct Encoding {
        huffman_name: bool,
        huffman_value: bool,
        /// 0: without indexing, 1: with incremental indexing, 2: never indexed.
        indexing: u8,
        /// Let the encoder use table matches (indexed fields, indexed names).
        best: bool,
    }

    fn encoding() -> impl Strategy<Value = Encoding> {
        (any::<bool>(), any::<bool>(), 0u8..3, any::<bool>()).prop_map(
            |(huffman_name, huffman_value, indexing, best)| Encoding {
                huffman_name,
                huffman_value,
                indexing,
                best,
            },
        )
    }

    fn header_name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b":authority".to_vec()),
            Just(b":method".to_vec()),
            Just(b":path".to_vec()),
            Just(b":scheme".to_vec()),
            Just(b"content-type".to_vec()),
            Just(b"te".to_vec()),
            Just(b"user-agent".to_vec()),
            "[a-z][a-z0-9-]{0,20}".prop_map(String::into_bytes),
        ]
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock".to_vec()),
            Just(b"POST".to_vec()),
            Just(b"localhost".to_vec()),
            "[ -~]{0,40}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..40),
        ]
    }

    #[derive(Debug, Clone)]
    struct Request {
        /// Dynamic-table size update at the start of the block, if any.
        size_update: Option<u32>,
        headers: Vec<(Vec<u8>, Vec<u8>, Encoding)>,
        end_stream: bool,
        padded: Option<u8>,
        priority: bool,
        /// Where the client splits its block into CONTINUATION frames.
        fragment_cuts: Vec<usize>,
        /// A frame that is not rewritten, sent after this block.
        trailing_frame: Option<(u8, u8, Vec<u8>)>,
    }

    fn request() -> impl Strategy<Value = Request> {
        (
            proptest::option::weighted(0.15, 0u32..=4096),
            proptest::collection::vec((header_name(), header_value(), encoding()), 0..12),
            any::<bool>(),
            proptest::option::of(any::<u8>()),
            any::<bool>(),
            proptest::collection::vec(any::<usize>(), 0..3),
            proptest::option::of((
                prop_oneof![
                    Just(DATA),
                    Just(PING),
                    Just(WINDOW_UPDATE),
                    Just(SETTINGS),
                    Just(0x3)
                ],
                any::<u8>(),
                proptest::collection::vec(any::<u8>(), 0..64),
            )),
        )
            .prop_map(
                |(
                    size_update,
                    headers,
                    end_stream,
                    padded,
                    priority,
                    fragment_cuts,
                    trailing_frame,
                )| Request {
                    size_update,
                    headers,
                    end_stream,
                    padded,
                    priority,
                    fragment_cuts,
                    trailing_frame,
                },
            )
    }

    /// Encodes a connection like an HTTP/2 client would and returns the bytes
    /// and the header lists that were sent.
    fn client_connection(requests: &[Request]) -> (Vec<u8>, Vec<HeaderList>) {
        let mut encoder = Encoder::default();
        let mut bytes = PREFACE.to_vec();
        let mut sent = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            let stream_id = 2 * index as u32 + 1;
            let mut block = Vec::new();
            if let Some(size) = request.size_update {
                encoder.update_max_dynamic_size(size, &mut block).unwrap();
            }
            for (name, value, encoding) in &request.headers {
                let mut flags = 0;
                if encoding.huffman_name {
                    flags |= Encoder::HUFFMAN_NAME;
                }
                if encoding.huffman_value {
                    flags |= Encoder::HUFFMAN_VALUE;
                }
                flags |= match encoding.indexing {
                    1 => Encoder::WITH_INDEXING,
                    2 => Encoder::NEVER_INDEXED,
                    _ => 0,
                };
                if encoding.best {
                    flags |= Encoder::BEST_FORMAT;
                }
                encoder
                    .encode((name.clone(), value.clone(), flags), &mut block)
                    .unwrap();
            }
            // A block that ends in a size update is invalid; such requests
            // always carry at least one header in practice.
            if request.headers.is_empty() && request.size_update.is_some() {
                encoder
                    .encode((b":method".to_vec(), b"GET".to_vec(), 0), &mut block)
                    .unwrap();
                sent.push(vec![(b":method".to_vec(), b"GET".to_vec())]);
            } else {
                sent.push(
                    request
                        .headers
                        .iter()
                        .map(|(n, v, _)| (n.clone(), v.clone()))
                        .collect(),
                );
            }

            let fragments = split_at_cuts(&block, &request.fragment_cuts);
            for (i, fragment) in fragments.iter().enumerate() {
                let last = i + 1 == fragments.len();
                let end_headers = if last { END_HEADERS } else { 0 };
                if i == 0 {
                    let mut flags = end_headers;
                    if request.end_stream {
                        flags |= END_STREAM;
                    }
                    let mut payload = Vec::new();
                    if let Some(pad) = request.padded {
                        flags |= PADDED;
                        payload.push(pad);
                    }
                    if request.priority {
                        flags |= PRIORITY;
                        payload.extend([0, 0, 0, 0, 15]);
                    }
                    payload.extend(fragment);
                    payload.extend(std::iter::repeat_n(
                        0,
                        usize::from(request.padded.unwrap_or(0)),
                    ));
                    bytes.extend(frame(HEADERS, flags, stream_id, &payload));
                } else {
                    bytes.extend(frame(CONTINUATION, end_headers, stream_id, fragment));
                }
            }
            if let Some((kind, flags, payload)) = &request.trailing_frame {
                bytes.extend(frame(*kind, *flags, stream_id, payload));
            }
        }
        (bytes, sent)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn rewrites_authority_and_keeps_everything_else(
            requests in proptest::collection::vec(request(), 1..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let (input, sent) = client_connection(&requests);
            let chunks = split_at_cuts(&input, &cuts);
            let out = rewrite_chunks(chunks.iter().map(Vec::as_slice)).unwrap();

            prop_assert_eq!(&out[..24], PREFACE);
            let (frames, rest) = parse_frames(&out[24..]);
            prop_assert_eq!(rest, 0);
            prop_assert!(frames.iter().all(|f| f.payload.len() <= MAX_OUTPUT_FRAME_LEN));
            let conversation = collect(&frames);
            prop_assert_eq!(conversation.blocks.len(), requests.len());

            // Each output block stands alone: a fresh decoder reads it.
            for (block, (request, sent)) in conversation.blocks.iter().zip(requests.iter().zip(&sent)) {
                assert_only_unindexed_literals(&block.fragment);
                prop_assert_eq!(block.flags & (PADDED | PRIORITY), 0);
                prop_assert_eq!(block.flags & END_STREAM != 0, request.end_stream);
                let decoded = loona_hpack::Decoder::new().decode(&block.fragment).unwrap();
                let expected: Vec<(Vec<u8>, Vec<u8>)> = sent
                    .iter()
                    .map(|(n, v)| {
                        let v = if n == b":authority" { b"localhost".to_vec() } else { v.clone() };
                        (n.clone(), v)
                    })
                    .collect();
                prop_assert_eq!(decoded, expected);
            }

            let expected_others: Vec<Frame> = requests
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    r.trailing_frame.as_ref().map(|(kind, flags, payload)| Frame {
                        kind: *kind,
                        flags: *flags,
                        stream_id: 2 * i as u32 + 1,
                        payload: payload.clone(),
                    })
                })
                .collect();
            prop_assert_eq!(conversation.others, expected_others);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut input = PREFACE.to_vec();
            input.extend(&bytes);
            let _ = rewrite_chunks(split_at_cuts(&input, &cuts).iter().map(Vec::as_slice));
            let _ = rewrite_chunks([&bytes[..]]);
        }

        #[test]
        fn arbitrary_header_payloads_never_panic(
            frames in proptest::collection::vec(
                (prop_oneof![Just(HEADERS), Just(CONTINUATION), Just(DATA)], any::<u8>(), 0u32..4,
                 proptest::collection::vec(any::<u8>(), 0..64)),
                1..8,
            ),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut input = PREFACE.to_vec();
            for (kind, flags, stream_id, payload) in &frames {
                input.extend(frame(*kind, *flags, *stream_id, payload));
            }
            let _ = rewrite_chunks(split_at_cuts(&input, &cuts).iter().map(Vec::as_slice));
        }
    }
}
