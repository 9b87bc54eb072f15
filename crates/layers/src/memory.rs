//! Memory files (`AGENTS.md` and others) loaded once per run and shown to the model in the
//! system prompt of every call.
//!
//! The same layer goes on two services (see the canonical stack in `docs/ordering.md`):
//!
//! - **agent** (`before_agent`): reads the files, in the order they were added, from their
//!   [`MemorySource`]s (a [`Directory`], a map, any storage backend through [`Stored`], or
//!   anything the host implements), and keeps
//!   the rendered text in the run's context. Model calls do not read them again.
//!   - A missing file is skipped with an [`Event::Warning`] (source `"memory"`).
//!   - A file that cannot be read fails the run before it starts, with an
//!     [`ErrorKind::Backend`] error naming the path; the error carries the session unchanged.
//!   - A file over the size limit ([`MemoryLayer::max_bytes`], default 64 KiB) is clipped at
//!     a character boundary, with a note saying so.
//! - **model** (`before_model`): appends the loaded text to the system prompt, after a blank
//!   line, each file as `<memory path="AGENTS.md">…</memory>`.
//!
//! ```
//! use std::collections::HashMap;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_agent_core::{AgentRequest, Error, ModelResponse, Session};
//! use tower_agent_layers::memory::MemoryLayer;
//! use tower_agent_loop::Agent;
//! use tower_agent_test::ScriptedModel;
//! use tower_agent_tools::ToolSet;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let files = HashMap::from([("AGENTS.md".to_owned(), "Run `cargo test` first.".to_owned())]);
//! let memory = MemoryLayer::new().file(files, "AGENTS.md");
//!
//! let model = ScriptedModel::new([ModelResponse::text("ok")]);
//! let stub = model.clone();
//! let model = ServiceBuilder::new().layer(memory.clone()).service(model);
//! let mut agent = ServiceBuilder::new()
//!     .layer(memory)
//!     .service(Agent::builder().system("You code.").build(model, ToolSet::new()));
//!
//! agent.ready().await?.call(AgentRequest::new(Session::new(), "hi")).await?;
//! let system = stub.requests()[0].system.clone().unwrap_or_default();
//! assert_eq!(
//!     &*system,
//!     "You code.\n\n<memory path=\"AGENTS.md\">\nRun `cargo test` first.\n</memory>"
//! );
//! # Ok(())
//! # }
//! ```
//!
//! [`Event::Warning`]: tower_agent_core::Event::Warning
//! [`ErrorKind::Backend`]: tower_agent_core::ErrorKind::Backend

use std::collections::HashMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_agent_core::callback::{Before, BeforeFuture};
use tower_agent_core::event::BoxFuture;
use tower_agent_core::{
    AgentRequest, AgentResponse, BeforeCallback, Error, Event, ExtensionKey, Flow, ModelRequest,
};
use tower_agent_storage::{Storage, StoragePath};
use tower_layer::Layer;
use tower_service::Service;

/// Where memory files come from: a small async trait the host can implement. Any storage
/// backend is one through [`Stored`] ([`MemoryLayer::from_storage`]).
pub trait MemorySource: Send + Sync + 'static {
    /// The text of the file at `path`; `Ok(None)` when there is no such file.
    ///
    /// # Errors
    ///
    /// The file exists but cannot be read: an error naming `path`.
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>>;

    /// A short description of the source for warnings, e.g. the directory.
    fn describe(&self) -> String {
        std::any::type_name::<Self>().to_owned()
    }
}

/// Files in memory, by path: for tests and for memory the host keeps itself.
impl MemorySource for HashMap<String, String> {
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(std::future::ready(Ok(self.get(path).cloned())))
    }

    fn describe(&self) -> String {
        "a map in memory".to_owned()
    }
}

/// Files under a directory of the local filesystem. A path that is absolute, climbs out of
/// the directory (`..`) or resolves outside it through a symbolic link is refused.
#[derive(Debug, Clone)]
pub struct Directory {
    root: PathBuf,
}

impl Directory {
    /// The files under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl MemorySource for Directory {
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(async move {
            let relative = Path::new(path);
            if !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            {
                return Err(Error::bad_request(format!(
                    "memory file `{path}` is not a relative path inside the directory"
                )));
            }
            let full = self.root.join(relative);
            // A symbolic link inside the directory may point out of it: read only what
            // resolves inside.
            let resolved = match tokio::fs::canonicalize(&full).await {
                Ok(resolved) => resolved,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(unreadable(&full, error)),
            };
            let root = tokio::fs::canonicalize(&self.root)
                .await
                .map_err(|error| unreadable(&self.root, error))?;
            if !resolved.starts_with(&root) {
                return Err(Error::bad_request(format!(
                    "memory file `{path}` resolves outside the directory"
                )));
            }
            match tokio::fs::read(&resolved).await {
                Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
                    Error::backend(format!(
                        "memory file `{}` is not UTF-8 text",
                        full.display()
                    ))
                }),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(unreadable(&full, error)),
            }
        })
    }

    fn describe(&self) -> String {
        format!("directory `{}`", self.root.display())
    }
}

/// Files in a storage backend of `tower-agent-storage` ([`InMemory`], [`LocalFs`], S3 and the
/// other `object_store` backends): a memory file's path is a
/// [`StoragePath`] in it. A path the backend refuses
/// (`..`, an empty segment) is a `BadRequest` error; a missing value is skipped.
///
/// [`InMemory`]: tower_agent_storage::InMemory
/// [`LocalFs`]: https://docs.rs/tower-agent-storage/latest/tower_agent_storage/struct.LocalFs.html
#[derive(Clone)]
pub struct Stored(Arc<dyn Storage>);

impl Stored {
    /// The files of `storage`.
    pub fn new(storage: impl Storage) -> Self {
        Self(Arc::new(storage))
    }

    /// The files of a backend shared with other layers.
    pub fn shared(storage: Arc<dyn Storage>) -> Self {
        Self(storage)
    }
}

impl fmt::Debug for Stored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Stored").finish_non_exhaustive()
    }
}

impl MemorySource for Stored {
    fn read<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(async move {
            let at = StoragePath::parse(path).map_err(|error| {
                Error::bad_request(format!("memory file `{path}`: {error}")).with_source(error)
            })?;
            match self.0.get(&at).await {
                Ok(bytes) => String::from_utf8(bytes.to_vec())
                    .map(Some)
                    .map_err(|_| Error::backend(format!("memory file `{at}` is not UTF-8 text"))),
                Err(error) if error.is_not_found() => Ok(None),
                Err(error) => Err(Error::backend(format!(
                    "memory file `{at}` could not be read: {error}"
                ))
                .with_source(error)),
            }
        })
    }

    fn describe(&self) -> String {
        "a storage backend".to_owned()
    }
}

/// The error of a file that exists but cannot be read, naming it.
fn unreadable(path: &Path, error: std::io::Error) -> Error {
    Error::backend(format!(
        "memory file `{}` could not be read: {error}",
        path.display()
    ))
    .with_source(error)
}

#[derive(Clone)]
struct File {
    source: Arc<dyn MemorySource>,
    path: Arc<str>,
}

/// Applies [`Memory`]; see the [module docs](self).
#[derive(Clone)]
pub struct MemoryLayer {
    files: Arc<[File]>,
    max_bytes: usize,
    /// Where the agent side leaves the run's rendered memory for the model side.
    loaded: ExtensionKey<Loaded>,
}

impl Default for MemoryLayer {
    fn default() -> Self {
        Self {
            files: Arc::from(Vec::new()),
            max_bytes: Self::DEFAULT_MAX_BYTES,
            loaded: ExtensionKey::new(),
        }
    }
}

impl MemoryLayer {
    /// The default of [`MemoryLayer::max_bytes`]: 64 KiB.
    pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;

    /// A layer with no file yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The files `paths` under the directory `root`, in order.
    pub fn from_dir<P: AsRef<str>>(
        root: impl Into<PathBuf>,
        paths: impl IntoIterator<Item = P>,
    ) -> Self {
        let source = Arc::new(Directory::new(root));
        paths.into_iter().fold(Self::new(), |layer, path| {
            layer.file_shared(Arc::clone(&source) as Arc<dyn MemorySource>, path.as_ref())
        })
    }

    /// The files `paths` of a storage backend (in memory, a directory, S3...), in order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_agent_storage::StorageError> {
    /// use tower_agent_layers::memory::MemoryLayer;
    /// use tower_agent_storage::{InMemory, Storage, StoragePath};
    ///
    /// let storage = InMemory::new();
    /// storage.put(&StoragePath::parse("/memories/AGENTS.md")?, "Be brief.".into()).await?;
    /// let memory = MemoryLayer::from_storage(storage, ["/memories/AGENTS.md"]);
    /// # let _ = memory;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_storage<P: AsRef<str>>(
        storage: impl Storage,
        paths: impl IntoIterator<Item = P>,
    ) -> Self {
        let source: Arc<dyn MemorySource> = Arc::new(Stored::new(storage));
        paths.into_iter().fold(Self::new(), |layer, path| {
            layer.file_shared(Arc::clone(&source), path.as_ref())
        })
    }

    /// Add the file `path` of `source`, after the files added before.
    pub fn file(self, source: impl MemorySource, path: impl AsRef<str>) -> Self {
        self.file_shared(Arc::new(source), path.as_ref())
    }

    /// Add the file `path` of a source shared with other files.
    pub fn file_shared(self, source: Arc<dyn MemorySource>, path: &str) -> Self {
        let mut files = self.files.to_vec();
        files.push(File {
            source,
            path: path.into(),
        });
        Self {
            files: files.into(),
            ..self
        }
    }

    /// Clip each file to `max_bytes` (at a character boundary), with a note.
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl fmt::Debug for MemoryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLayer")
            .field(
                "files",
                &self.files.iter().map(|f| &*f.path).collect::<Vec<_>>(),
            )
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl<S> Layer<S> for MemoryLayer {
    type Service = Memory<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Memory {
            inner: Before::new(
                inner,
                LoadMemory {
                    files: Arc::clone(&self.files),
                    max_bytes: self.max_bytes,
                    loaded: self.loaded.clone(),
                },
            ),
            loaded: self.loaded.clone(),
        }
    }
}

/// Loads memory files at the agent, shows them at the model; see the [module docs](self).
///
/// At the agent, readiness works as [`Before`]'s (the files are read before the inner call,
/// so the inner service is cloned). At the model, `poll_ready` and the response future are the
/// inner service's.
#[derive(Clone, Debug)]
pub struct Memory<S> {
    inner: Before<S, LoadMemory>,
    loaded: ExtensionKey<Loaded>,
}

impl<S> Memory<S> {
    /// Wrap `inner` with the files of `layer`.
    pub fn new(inner: S, layer: &MemoryLayer) -> Self {
        layer.layer(inner)
    }

    /// A layer for this service.
    pub fn layer() -> MemoryLayer {
        MemoryLayer::new()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut()
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }
}

impl<S> Service<AgentRequest> for Memory<S>
where
    S: Service<AgentRequest, Response = AgentResponse> + Clone,
    S::Error: From<Error>,
{
    type Response = AgentResponse;
    type Error = S::Error;
    type Future = BeforeFuture<LoadMemory, S, AgentRequest>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<AgentRequest>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, req: AgentRequest) -> Self::Future {
        self.inner.call(req)
    }
}

impl<S> Service<ModelRequest> for Memory<S>
where
    S: Service<ModelRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.get_mut().poll_ready(cx)
    }

    fn call(&mut self, mut req: ModelRequest) -> Self::Future {
        if let Some(Loaded(text)) = req.ctx.extension_at(&self.loaded) {
            req.append_system(&text);
        }
        self.inner.get_mut().call(req)
    }
}

/// The rendered memory of a run, kept in its context (under the layer's key: two memory
/// layers in one run keep theirs apart).
#[derive(Clone)]
struct Loaded(Arc<str>);

/// The `before_agent` callback of [`Memory`]: reads the files into the run's context. Public
/// because [`Memory`]'s agent response future names it.
#[derive(Clone)]
pub struct LoadMemory {
    files: Arc<[File]>,
    max_bytes: usize,
    loaded: ExtensionKey<Loaded>,
}

impl fmt::Debug for LoadMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadMemory")
            .field("files", &self.files.len())
            .finish()
    }
}

impl BeforeCallback<AgentRequest> for LoadMemory {
    type Response = AgentResponse;
    type Future = BoxFuture<'static, Result<Flow<AgentRequest, AgentResponse>, Error>>;

    fn before(&mut self, req: AgentRequest) -> Self::Future {
        let files = Arc::clone(&self.files);
        let max_bytes = self.max_bytes;
        let loaded = self.loaded.clone();
        Box::pin(async move {
            match load(&files, max_bytes, &req).await {
                Ok(Some(text)) => req.ctx.insert_extension_at(&loaded, Loaded(text.into())),
                Ok(None) => {}
                // The run never started: give the session back as it came.
                Err(error) => return Err(error.with_session(req.session)),
            }
            Ok(Flow::Continue(req))
        })
    }
}

/// Read and render the files; `None` when none was found.
async fn load(
    files: &[File],
    max_bytes: usize,
    req: &AgentRequest,
) -> Result<Option<String>, Error> {
    let mut text = String::new();
    for file in files {
        let Some(content) = file.source.read(&file.path).await? else {
            let message = format!(
                "memory file `{}` not found in {}: skipped",
                file.path,
                file.source.describe()
            );
            tracing::warn!(target: "tower_agent::memory", "{message}");
            req.ctx
                .emit(Event::Warning {
                    source: "memory",
                    message,
                })
                .await?;
            continue;
        };
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&format!("<memory path=\"{}\">\n", file.path));
        text.push_str(clip(&content, max_bytes));
        if content.len() > max_bytes {
            text.push_str(&format!(
                "\n[clipped: this file has {} bytes; the first {} are shown]",
                content.len(),
                clip(&content, max_bytes).len()
            ));
        }
        text.push_str("\n</memory>");
    }
    Ok((!text.is_empty()).then_some(text))
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends at a character
/// boundary.
fn clip(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Memory files loaded once per run on the agent, and shown to the model.
impl tower_agent_loop::Builtin for MemoryLayer {
    fn place(self, stacks: &mut tower_agent_loop::Stacks) {
        use tower_agent_loop::{AgentSlot, ModelSlot};
        stacks.agent(AgentSlot::Memory, self.clone());
        stacks.model(ModelSlot::Memory, self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_keeps_whole_characters() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("héllo", 3), "hé");
        assert_eq!(clip("abc", 10), "abc");
    }
}
