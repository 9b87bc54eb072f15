//! Storage backends for [tower-agent](https://docs.rs/tower-agent): where large tool results,
//! offloaded conversation history and memory files live.
//!
//! One small async trait, [`Storage`]: put, get, read a byte range, list a prefix, delete, and
//! streaming put and get for large values. Three implementations:
//!
//! | backend | feature | for |
//! |---|---|---|
//! | [`InMemory`] | always | tests, short-lived agents |
//! | [`LocalFs`] | `fs` (default) | a directory: writes are atomic (a temporary file, then a rename), and no path can leave the root |
//! | `ObjectStoreStorage` | `object-store` (`aws` for S3) | S3 and compatible servers, GCS, Azure, through the `object_store` crate |
//!
//! Paths are [`StoragePath`]s: `/`-separated, relative to the backend's root, checked when
//! made (no `..`, no `.`, no backslash, no NUL, no empty segment), so a tool name or a call id
//! that a model wrote cannot reach outside it.
//!
//! ```
//! use bytes::Bytes;
//! use tower_agent_storage::{InMemory, Storage, StoragePath};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_agent_storage::StorageError> {
//! let storage = InMemory::new();
//! let path = StoragePath::parse("/large_tool_results/search_call_1")?;
//! storage.put(&path, Bytes::from("line 1\nline 2\n")).await?;
//! assert_eq!(storage.get_range(&path, 7..13).await?, "line 2");
//! let listed = storage.list("large_tool_results/").await?;
//! assert_eq!(listed[0].path.as_str(), "large_tool_results/search_call_1");
//! assert_eq!(listed[0].size, 14);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};

use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use futures_util::StreamExt;

#[cfg(feature = "fs")]
mod fs;
#[cfg(feature = "object-store")]
mod object;

#[cfg(feature = "fs")]
pub use fs::LocalFs;
#[cfg(feature = "object-store")]
pub use object::ObjectStoreStorage;

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A stream of chunks: what streaming put takes and streaming get gives.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, StorageError>> + Send>>;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Nothing is stored at the path.
    #[error("not found: {0}")]
    NotFound(String),
    /// The path cannot be used.
    #[error("invalid storage path {path:?}: {reason}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The backend failed (I/O, network, the server).
    #[error("storage backend failed: {message}")]
    Backend {
        /// What failed, without secrets.
        message: String,
        /// The cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl StorageError {
    /// A backend failure with `message`.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        StorageError::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether this is [`StorageError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound(_))
    }
}

impl From<StorageError> for tower_agent_core::Error {
    fn from(error: StorageError) -> Self {
        let kind = match &error {
            StorageError::InvalidPath { .. } => tower_agent_core::ErrorKind::BadRequest,
            _ => tower_agent_core::ErrorKind::Backend,
        };
        tower_agent_core::Error::new(kind, error.to_string()).with_source(error)
    }
}

/// A checked path inside a backend: `/`-separated segments, relative to its root.
///
/// A leading `/` is accepted and dropped. Refused: an empty path or segment, `.` and `..`,
/// a backslash, a NUL, a segment over 255 bytes or a path over 1,024 bytes.
///
/// ```
/// use tower_agent_storage::StoragePath;
///
/// assert_eq!(StoragePath::parse("/a/b.txt").unwrap().as_str(), "a/b.txt");
/// for bad in ["", "/", "a//b", "../etc/passwd", "a/./b", "a\\b", "a\0b"] {
///     assert!(StoragePath::parse(bad).is_err(), "{bad:?}");
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoragePath(String);

impl StoragePath {
    /// The longest path accepted, in bytes.
    pub const MAX_LEN: usize = 1024;
    /// The longest segment accepted, in bytes (a common filesystem limit).
    pub const MAX_SEGMENT: usize = 255;

    /// Check `path`.
    pub fn parse(path: &str) -> Result<Self, StorageError> {
        let invalid = |reason| StorageError::InvalidPath {
            path: path.chars().take(200).collect(),
            reason,
        };
        let trimmed = path.strip_prefix('/').unwrap_or(path);
        if trimmed.is_empty() {
            return Err(invalid("it is empty"));
        }
        if trimmed.len() > Self::MAX_LEN {
            return Err(invalid("it is longer than 1,024 bytes"));
        }
        if trimmed.contains('\0') {
            return Err(invalid("it contains a NUL"));
        }
        if trimmed.contains('\\') {
            return Err(invalid("it contains a backslash"));
        }
        for segment in trimmed.split('/') {
            match segment {
                "" => return Err(invalid("it has an empty segment")),
                "." | ".." => return Err(invalid("it has a `.` or `..` segment")),
                s if s.len() > Self::MAX_SEGMENT => {
                    return Err(invalid("a segment is longer than 255 bytes"));
                }
                _ => {}
            }
        }
        Ok(Self(trimmed.to_owned()))
    }

    /// The path, without a leading `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The segments.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl fmt::Display for StoragePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.0)
    }
}

impl std::str::FromStr for StoragePath {
    type Err = StorageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// One stored value, as [`Storage::list`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its path.
    pub path: StoragePath,
    /// Its size in bytes.
    pub size: u64,
}

/// A storage backend. Object-safe: share one as `Arc<dyn Storage>`.
///
/// Reads of a missing path fail with [`StorageError::NotFound`]; deleting one succeeds.
pub trait Storage: Send + Sync + 'static {
    /// Store `data` at `path`, replacing what was there. Readers see the old value or the new
    /// one, never a part.
    fn put<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>>;

    /// Store the chunks of `data` at `path` without holding the whole value in memory;
    /// returns the bytes written. A failing stream stores nothing.
    fn put_stream<'a>(
        &'a self,
        path: &'a StoragePath,
        data: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>>;

    /// The value at `path`.
    fn get<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>>;

    /// The bytes `range` of the value at `path`, clipped to its end (empty past it).
    fn get_range<'a>(
        &'a self,
        path: &'a StoragePath,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>>;

    /// The value at `path` in chunks, without holding it whole.
    fn get_stream<'a>(
        &'a self,
        path: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>>;

    /// The values whose path starts with `prefix` (a string prefix: `"a/"` lists inside `a`,
    /// `"a/b"` also matches `a/bc`), ordered by path.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>>;

    /// Remove the value at `path`; a missing one is not an error.
    fn delete<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>>;

    /// Append `data` to the value at `path` (creating it). The default reads the value and
    /// writes it back whole; backends that can append natively override it. Not safe against
    /// concurrent appenders to the same path.
    fn append<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            let current = match self.get(path).await {
                Ok(current) => current,
                Err(StorageError::NotFound(_)) => Bytes::new(),
                Err(error) => return Err(error),
            };
            let mut joined = BytesMut::with_capacity(current.len() + data.len());
            joined.extend_from_slice(&current);
            joined.extend_from_slice(&data);
            self.put(path, joined.freeze()).await
        })
    }
}

impl<S: Storage + ?Sized> Storage for Arc<S> {
    fn put<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        (**self).put(path, data)
    }

    fn put_stream<'a>(
        &'a self,
        path: &'a StoragePath,
        data: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        (**self).put_stream(path, data)
    }

    fn get<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        (**self).get(path)
    }

    fn get_range<'a>(
        &'a self,
        path: &'a StoragePath,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        (**self).get_range(path, range)
    }

    fn get_stream<'a>(
        &'a self,
        path: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        (**self).get_stream(path)
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        (**self).list(prefix)
    }

    fn delete<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        (**self).delete(path)
    }

    fn append<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        (**self).append(path, data)
    }
}

/// Clip `range` to a value of `len` bytes.
pub(crate) fn clip(range: Range<u64>, len: u64) -> Range<u64> {
    let start = range.start.min(len);
    start..range.end.clamp(start, len)
}

/// Values in memory, shared by clones.
#[derive(Clone, Default)]
pub struct InMemory {
    values: Arc<RwLock<BTreeMap<String, Bytes>>>,
}

impl InMemory {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Bytes>> {
        self.values.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Bytes>> {
        self.values.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn lookup(&self, path: &StoragePath) -> Result<Bytes, StorageError> {
        self.read()
            .get(path.as_str())
            .cloned()
            .ok_or_else(|| StorageError::NotFound(path.to_string()))
    }
}

impl fmt::Debug for InMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemory")
            .field("values", &self.read().len())
            .finish()
    }
}

impl Storage for InMemory {
    fn put<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        self.write().insert(path.as_str().to_owned(), data);
        Box::pin(std::future::ready(Ok(())))
    }

    fn put_stream<'a>(
        &'a self,
        path: &'a StoragePath,
        mut data: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        Box::pin(async move {
            let mut value = BytesMut::new();
            while let Some(chunk) = data.next().await {
                value.extend_from_slice(&chunk?);
            }
            let len = value.len() as u64;
            self.write()
                .insert(path.as_str().to_owned(), value.freeze());
            Ok(len)
        })
    }

    fn get<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(std::future::ready(self.lookup(path)))
    }

    fn get_range<'a>(
        &'a self,
        path: &'a StoragePath,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        let value = self.lookup(path).map(|value| {
            let range = clip(range, value.len() as u64);
            // In range of a value held in memory: fits `usize`.
            value.slice(range.start as usize..range.end as usize)
        });
        Box::pin(std::future::ready(value))
    }

    fn get_stream<'a>(
        &'a self,
        path: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        let stream = self.lookup(path).map(|value| {
            let chunks: Vec<Result<Bytes, StorageError>> = (0..value.len())
                .step_by(64 * 1024)
                .map(|start| Ok(value.slice(start..value.len().min(start + 64 * 1024))))
                .collect();
            Box::pin(futures_util::stream::iter(chunks)) as ByteStream
        });
        Box::pin(std::future::ready(stream))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
        let entries = self
            .read()
            .range(prefix.to_owned()..)
            .take_while(|(path, _)| path.starts_with(prefix))
            .map(|(path, value)| Entry {
                path: StoragePath(path.clone()),
                size: value.len() as u64,
            })
            .collect();
        Box::pin(std::future::ready(Ok(entries)))
    }

    fn delete<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        self.write().remove(path.as_str());
        Box::pin(std::future::ready(Ok(())))
    }

    fn append<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        let mut values = self.write();
        let joined = match values.get(path.as_str()) {
            Some(current) => {
                let mut joined = BytesMut::with_capacity(current.len() + data.len());
                joined.extend_from_slice(current);
                joined.extend_from_slice(&data);
                joined.freeze()
            }
            None => data,
        };
        values.insert(path.as_str().to_owned(), joined);
        Box::pin(std::future::ready(Ok(())))
    }
}
