//! Files through the API: request bodies streamed to disk under a size limit (dataset and checkpoint
//! uploads), and files streamed back as response bodies (downloads), never held in memory whole.

use std::path::{Path, PathBuf};

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{ApiError, ApiResult, ProblemType};

/// Removes a partial upload however the handler ends, unless [`PartialFile::keep`] is called.
#[derive(Debug)]
pub struct PartialFile(Option<PathBuf>);

impl PartialFile {
    pub fn new(path: PathBuf) -> Self {
        PartialFile(Some(path))
    }

    /// The upload is complete (and renamed): leave it.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    pub bytes: u64,
    /// Lowercase hex sha256 of the content.
    pub sha256: String,
}

/// Streams `body` into a new file at `path`, failing with 413 (and removing nothing: the caller's
/// [`PartialFile`] does) once more than `limit` bytes arrived.
pub async fn stream_to_file(body: Body, path: &Path, limit: u64, what: &str) -> ApiResult<Written> {
    let mut file = tokio::fs::File::create(path).await.map_err(ApiError::internal)?;
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the upload failed: {e}")))?;
        written += chunk.len() as u64;
        if written > limit {
            return Err(too_large(what, limit));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(ApiError::internal)?;
    }
    file.flush().await.map_err(ApiError::internal)?;
    Ok(Written { bytes: written, sha256: crate::hex(&hasher.finalize()) })
}

pub fn too_large(what: &str, limit: u64) -> ApiError {
    ApiError::new(
        ProblemType::PayloadTooLarge,
        format!("{what} may be at most {} ({limit} bytes)", ringtrain_core::memory::human_bytes(limit)),
    )
}

/// Answers 413 before reading anything when Content-Length already says the body is too large; else the
/// declared length (0 when there is none).
pub fn check_declared_length(headers: &axum::http::HeaderMap, limit: u64, what: &str) -> ApiResult<u64> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit => Err(too_large(what, limit)),
        other => Ok(other.unwrap_or(0)),
    }
}

const CHUNK: usize = 1 << 20;

/// The file as an `application/octet-stream` body, read in 1 MiB chunks as the client takes them.
pub async fn file_response(path: &Path) -> ApiResult<Response> {
    file_range_response(path, 0, None).await
}

/// `length` bytes of the file at `path` from `offset` on (to its end when `None`), streamed: a member of a
/// checkpoint archive is served from inside the archive, never copied out first (a copy per download
/// would be disk no quota counts).
pub async fn file_range_response(path: &Path, offset: u64, length: Option<u64>) -> ApiResult<Response> {
    let mut file = tokio::fs::File::open(path).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ApiError::not_found("its file is gone from the server")
        } else {
            ApiError::internal(e)
        }
    })?;
    let size = file.metadata().await.map_err(ApiError::internal)?.len();
    let length = length.unwrap_or(size.saturating_sub(offset)).min(size.saturating_sub(offset));
    file.seek(std::io::SeekFrom::Start(offset)).await.map_err(ApiError::internal)?;
    let chunks = futures_util::stream::unfold(Some(file.take(length)), |file| async move {
        let mut file = file?;
        let mut buffer = vec![0u8; CHUNK];
        match file.read(&mut buffer).await {
            Ok(0) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((Ok::<Bytes, std::io::Error>(Bytes::from(buffer)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
    // The compression layer polls a body once more after its end; `unfold` panics on that, a fused stream
    // keeps answering None (found by the browser test's download, which asks for gzip).
    .fuse();
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, length.to_string())],
        Body::from_stream(chunks),
    )
        .into_response())
}

/// `path` (as stored) if it lies under `root` once both are canonical (links and `..` resolved); else 404.
/// Every file the server serves was written by the server under its data directory; a stored path that
/// leads anywhere else (an older database, a tampered row) is never served.
pub async fn under(root: &Path, path: &Path) -> ApiResult<std::path::PathBuf> {
    let gone = || ApiError::not_found("its file is gone from the server");
    let root = tokio::fs::canonicalize(root).await.map_err(|_| gone())?;
    let path = tokio::fs::canonicalize(path).await.map_err(|_| gone())?;
    if path.starts_with(&root) {
        Ok(path)
    } else {
        tracing::warn!(path = %path.display(), root = %root.display(), "refused to serve a file outside its folder");
        Err(gone())
    }
}
