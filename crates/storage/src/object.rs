//! Any `object_store` backend: S3 and compatible servers, GCS, Azure, local files.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload, WriteMultipart};

use crate::{BoxFuture, ByteStream, Entry, Storage, StorageError, StoragePath, clip};

/// How many parts of a streaming upload may be in flight at once.
const UPLOADS_IN_FLIGHT: usize = 4;

/// Values in any [`ObjectStore`]: `object_store`'s S3 (and MinIO, R2, moto), GCS, Azure or
/// local implementations, one crate that the Arrow project keeps.
///
/// ```no_run
/// # #[cfg(feature = "aws")]
/// # fn main() -> Result<(), object_store::Error> {
/// use std::sync::Arc;
/// use object_store::aws::AmazonS3Builder;
/// use tower_agent_storage::ObjectStoreStorage;
///
/// let s3 = AmazonS3Builder::from_env().with_bucket_name("agent-results").build()?;
/// let storage = ObjectStoreStorage::new(Arc::new(s3));
/// # let _ = storage;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "aws"))]
/// # fn main() {}
/// ```
#[derive(Clone)]
pub struct ObjectStoreStorage {
    store: Arc<dyn ObjectStore>,
}

impl ObjectStoreStorage {
    /// Values in `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }
}

impl fmt::Debug for ObjectStoreStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The store's `Display` names the backend and bucket, never credentials.
        f.debug_struct("ObjectStoreStorage")
            .field("store", &format_args!("{}", self.store))
            .finish()
    }
}

fn location(path: &StoragePath) -> Path {
    Path::from_iter(path.segments())
}

fn error(path: &StoragePath, what: &str, error: object_store::Error) -> StorageError {
    match error {
        object_store::Error::NotFound { .. } => StorageError::NotFound(path.to_string()),
        other => StorageError::backend(format!("{what} {path}"), other),
    }
}

impl Storage for ObjectStoreStorage {
    fn put<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            self.store
                .put(&location(path), PutPayload::from_bytes(data))
                .await
                .map(|_| ())
                .map_err(|e| error(path, "cannot write", e))
        })
    }

    fn put_stream<'a>(
        &'a self,
        path: &'a StoragePath,
        mut data: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        Box::pin(async move {
            let upload = self
                .store
                .put_multipart(&location(path))
                .await
                .map_err(|e| error(path, "cannot start writing", e))?;
            let mut upload = WriteMultipart::new(upload);
            let mut len = 0_u64;
            while let Some(chunk) = data.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(failure) => {
                        let _ = upload.abort().await;
                        return Err(failure);
                    }
                };
                if let Err(e) = upload.wait_for_capacity(UPLOADS_IN_FLIGHT).await {
                    return Err(error(path, "cannot write", e));
                }
                len += chunk.len() as u64;
                upload.put(chunk);
            }
            upload
                .finish()
                .await
                .map_err(|e| error(path, "cannot finish writing", e))?;
            Ok(len)
        })
    }

    fn get<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async move {
            let result = self
                .store
                .get(&location(path))
                .await
                .map_err(|e| error(path, "cannot read", e))?;
            result
                .bytes()
                .await
                .map_err(|e| error(path, "cannot read", e))
        })
    }

    fn get_range<'a>(
        &'a self,
        path: &'a StoragePath,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async move {
            let at = location(path);
            let meta = self
                .store
                .head(&at)
                .await
                .map_err(|e| error(path, "cannot inspect", e))?;
            let range = clip(range, meta.size);
            if range.is_empty() {
                return Ok(Bytes::new());
            }
            self.store
                .get_range(&at, range)
                .await
                .map_err(|e| error(path, "cannot read", e))
        })
    }

    fn get_stream<'a>(
        &'a self,
        path: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        Box::pin(async move {
            let result = self
                .store
                .get(&location(path))
                .await
                .map_err(|e| error(path, "cannot read", e))?;
            let shown = path.clone();
            let stream = result
                .into_stream()
                .map_err(move |e| error(&shown, "cannot read", e));
            Ok(Box::pin(stream) as ByteStream)
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        Box::pin(async move {
            let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
            // object_store lists by whole segments: list the directory, filter by string.
            let dir = prefix.rfind('/').map(|end| &prefix[..end]);
            let dir = dir
                .filter(|d| !d.is_empty())
                .map(|d| Path::from_iter(d.split('/')));
            let mut listed = self.store.list(dir.as_ref());
            let mut entries = Vec::new();
            while let Some(meta) = listed.next().await {
                let meta =
                    meta.map_err(|e| StorageError::backend(format!("cannot list /{prefix}"), e))?;
                let name = meta.location.as_ref();
                if !name.starts_with(prefix) {
                    continue;
                }
                if let Ok(path) = StoragePath::parse(name) {
                    entries.push(Entry {
                        path,
                        size: meta.size,
                    });
                }
            }
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(entries)
        })
    }

    fn delete<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            match self.store.delete(&location(path)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(error(path, "cannot delete", e)),
            }
        })
    }
}
