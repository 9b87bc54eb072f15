//! A directory on the local filesystem.

use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::{BoxFuture, ByteStream, Entry, Storage, StorageError, StoragePath, clip};

/// The suffix of files being written; they are never listed.
const PARTIAL: &str = ".partial-";
/// The size of the chunks [`Storage::get_stream`] reads.
const CHUNK: usize = 64 * 1024;

/// Values as files under a root directory.
///
/// - **Atomic writes**: a value is written to a temporary file next to its place, flushed,
///   then renamed over it, so a reader sees the old value or the new one and a crash leaves
///   no half-written value.
/// - **A root no path can escape**: [`StoragePath`] has no `..`, and a symbolic link on the
///   way (a directory or the file itself) is refused, so a link planted inside the root
///   cannot lead outside it.
#[derive(Debug, Clone)]
pub struct LocalFs {
    root: PathBuf,
}

impl LocalFs {
    /// Values under `root`, which is created on the first write if missing.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of `path`, after checking that no symbolic link is on the way.
    async fn resolve(&self, path: &StoragePath) -> Result<PathBuf, StorageError> {
        let mut file = self.root.clone();
        for segment in path.segments() {
            file.push(segment);
            match tokio::fs::symlink_metadata(&file).await {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(StorageError::InvalidPath {
                        path: path.to_string(),
                        reason: "a symbolic link is on the way",
                    });
                }
                Ok(_) => {}
                // Nothing further exists: nothing further can be a link.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => break,
                Err(error) => return Err(io(path, "cannot inspect", error)),
            }
        }
        Ok(self.root.join(path.as_str()))
    }

    /// A temporary file next to `file`, its parent created.
    async fn partial(file: &Path, path: &StoragePath) -> Result<PathBuf, StorageError> {
        if let Some(parent) = file.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io(path, "cannot create the directory of", e))?;
        }
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("value");
        Ok(file.with_file_name(format!("{name}{PARTIAL}{}", uuid::Uuid::new_v4())))
    }

    async fn open(&self, path: &StoragePath) -> Result<tokio::fs::File, StorageError> {
        let file = self.resolve(path).await?;
        tokio::fs::File::open(&file).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StorageError::NotFound(path.to_string())
            } else {
                io(path, "cannot open", e)
            }
        })
    }
}

fn io(path: &StoragePath, what: &str, error: std::io::Error) -> StorageError {
    StorageError::backend(format!("{what} {path}"), error)
}

/// Write the chunks of `data` to a temporary file, then rename it to `file`.
async fn write_atomically(
    file: &Path,
    path: &StoragePath,
    mut data: ByteStream,
) -> Result<u64, StorageError> {
    let partial = LocalFs::partial(file, path).await?;
    let written = async {
        let mut out = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| io(path, "cannot create", e))?;
        let mut len = 0_u64;
        while let Some(chunk) = data.next().await {
            let chunk = chunk?;
            out.write_all(&chunk)
                .await
                .map_err(|e| io(path, "cannot write", e))?;
            len += chunk.len() as u64;
        }
        out.sync_all()
            .await
            .map_err(|e| io(path, "cannot flush", e))?;
        Ok::<_, StorageError>(len)
    }
    .await;
    let len = match written {
        Ok(len) => len,
        Err(error) => {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(error);
        }
    };
    if let Err(error) = tokio::fs::rename(&partial, file).await {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(io(path, "cannot rename into", error));
    }
    Ok(len)
}

impl Storage for LocalFs {
    fn put<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            let file = self.resolve(path).await?;
            let once = futures_util::stream::once(async move { Ok(data) });
            write_atomically(&file, path, Box::pin(once))
                .await
                .map(|_| ())
        })
    }

    fn put_stream<'a>(
        &'a self,
        path: &'a StoragePath,
        data: ByteStream,
    ) -> BoxFuture<'a, Result<u64, StorageError>> {
        Box::pin(async move {
            let file = self.resolve(path).await?;
            write_atomically(&file, path, data).await
        })
    }

    fn get<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async move {
            let mut file = self.open(path).await?;
            let mut value = Vec::new();
            file.read_to_end(&mut value)
                .await
                .map_err(|e| io(path, "cannot read", e))?;
            Ok(Bytes::from(value))
        })
    }

    fn get_range<'a>(
        &'a self,
        path: &'a StoragePath,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, StorageError>> {
        Box::pin(async move {
            let mut file = self.open(path).await?;
            let len = file
                .metadata()
                .await
                .map_err(|e| io(path, "cannot inspect", e))?
                .len();
            let range = clip(range, len);
            file.seek(SeekFrom::Start(range.start))
                .await
                .map_err(|e| io(path, "cannot seek in", e))?;
            let want = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
            let mut value = Vec::with_capacity(want.min(16 * 1024 * 1024));
            (&mut file)
                .take(range.end - range.start)
                .read_to_end(&mut value)
                .await
                .map_err(|e| io(path, "cannot read", e))?;
            Ok(Bytes::from(value))
        })
    }

    fn get_stream<'a>(
        &'a self,
        path: &'a StoragePath,
    ) -> BoxFuture<'a, Result<ByteStream, StorageError>> {
        Box::pin(async move {
            let file = self.open(path).await?;
            let shown = path.clone();
            let stream = futures_util::stream::unfold(Some(file), move |file| {
                let shown = shown.clone();
                async move {
                    let mut file = file?;
                    let mut chunk = vec![0; CHUNK];
                    match file.read(&mut chunk).await {
                        Ok(0) => None,
                        Ok(n) => {
                            chunk.truncate(n);
                            Some((Ok(Bytes::from(chunk)), Some(file)))
                        }
                        Err(e) => Some((Err(io(&shown, "cannot read", e)), None)),
                    }
                }
            });
            Ok(Box::pin(stream) as ByteStream)
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StorageError>> {
        Box::pin(async move {
            let prefix = prefix.strip_prefix('/').unwrap_or(prefix);
            // Walk only the directory the prefix is in.
            let dir = match prefix.rfind('/') {
                Some(end) => &prefix[..end],
                None => "",
            };
            let mut entries = Vec::new();
            let mut pending = vec![dir.to_owned()];
            while let Some(relative) = pending.pop() {
                let mut read = match tokio::fs::read_dir(self.root.join(&relative)).await {
                    Ok(read) => read,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(StorageError::backend(format!("cannot list /{relative}"), e));
                    }
                };
                while let Some(item) = read
                    .next_entry()
                    .await
                    .map_err(|e| StorageError::backend(format!("cannot list /{relative}"), e))?
                {
                    let Some(name) = item.file_name().to_str().map(str::to_owned) else {
                        continue;
                    };
                    let path = if relative.is_empty() {
                        name.clone()
                    } else {
                        format!("{relative}/{name}")
                    };
                    let Ok(kind) = item.file_type().await else {
                        continue;
                    };
                    if kind.is_dir() {
                        if path.starts_with(prefix) || prefix.starts_with(&format!("{path}/")) {
                            pending.push(path);
                        }
                    } else if kind.is_file() && path.starts_with(prefix) && !name.contains(PARTIAL)
                    {
                        let size = item.metadata().await.map(|m| m.len()).unwrap_or(0);
                        if let Ok(path) = StoragePath::parse(&path) {
                            entries.push(Entry { path, size });
                        }
                    }
                }
            }
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(entries)
        })
    }

    fn delete<'a>(&'a self, path: &'a StoragePath) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            let file = self.resolve(path).await?;
            match tokio::fs::remove_file(&file).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io(path, "cannot delete", e)),
            }
        })
    }

    fn append<'a>(
        &'a self,
        path: &'a StoragePath,
        data: Bytes,
    ) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            let file = self.resolve(path).await?;
            if let Some(parent) = file.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(|e| io(path, "cannot create the directory of", e))?;
            }
            let mut out = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .await
                .map_err(|e| io(path, "cannot open", e))?;
            out.write_all(&data)
                .await
                .map_err(|e| io(path, "cannot append to", e))?;
            out.flush().await.map_err(|e| io(path, "cannot flush", e))
        })
    }
}
