//! An MCP server to connect to, as the host configures it.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// An MCP server to connect to: a name (it prefixes the server's tools when two servers have
/// a tool of the same name) and how to reach it.
#[derive(Clone)]
pub struct McpServer {
    pub(crate) name: String,
    pub(crate) transport: Transport,
    ping: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) list_timeout: Duration,
    required: bool,
    pub(crate) trust_hints: bool,
}

/// How often a server is pinged while a call waits for it, by default.
const PING: Duration = Duration::from_secs(15);

/// How long connecting (starting the process or reaching the URL, and MCP's `initialize`)
/// may take, by default.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long listing the tools (every page) may take, by default.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach a server. Both variants exist whatever the features; only a constructor of
/// an enabled transport can make one.
#[derive(Clone)]
#[cfg_attr(not(all(feature = "stdio", feature = "http")), allow(dead_code))]
pub(crate) enum Transport {
    Stdio {
        program: OsString,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        dir: Option<PathBuf>,
    },
    Http {
        url: String,
        bearer: Option<String>,
    },
}

impl McpServer {
    /// A server started as a child process running `program`, spoken to over its stdin and
    /// stdout. It is started again when the connection is lost, and killed when the last
    /// clone of the [`McpTools`](crate::McpTools) is dropped.
    #[cfg(feature = "stdio")]
    pub fn stdio(name: impl Into<String>, program: impl Into<OsString>) -> Self {
        Self {
            name: name.into(),
            transport: Transport::Stdio {
                program: program.into(),
                args: Vec::new(),
                env: Vec::new(),
                dir: None,
            },
            ping: PING,
            connect_timeout: CONNECT_TIMEOUT,
            list_timeout: LIST_TIMEOUT,
            required: false,
            trust_hints: false,
        }
    }

    /// A server at `url` (its MCP endpoint, often `.../mcp`), over streamable HTTP.
    #[cfg(feature = "http")]
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            transport: Transport::Http {
                url: url.into(),
                bearer: None,
            },
            ping: PING,
            connect_timeout: CONNECT_TIMEOUT,
            list_timeout: LIST_TIMEOUT,
            required: false,
            trust_hints: false,
        }
    }

    /// An argument of the program (stdio).
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        if let Transport::Stdio { args, .. } = &mut self.transport {
            args.push(arg.into());
        }
        self
    }

    /// Arguments of the program (stdio).
    pub fn args(self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        args.into_iter().fold(self, Self::arg)
    }

    /// An environment variable of the program (stdio). Its value never shows in `Debug`.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        if let Transport::Stdio { env, .. } = &mut self.transport {
            env.push((key.into(), value.into()));
        }
        self
    }

    /// The program's working directory (stdio).
    pub fn current_dir(mut self, path: impl Into<PathBuf>) -> Self {
        if let Transport::Stdio { dir, .. } = &mut self.transport {
            *dir = Some(path.into());
        }
        self
    }

    /// A bearer token sent with every request (HTTP). It never shows in `Debug` or errors.
    pub fn bearer(mut self, token: impl Into<String>) -> Self {
        if let Transport::Http { bearer, .. } = &mut self.transport {
            *bearer = Some(token.into());
        }
        self
    }

    /// Ping the server (MCP's `ping`) this often while a call waits for its answer (HTTP; 15 s by
    /// default; zero: never). A ping that fails, or gets no answer in the same time, means the
    /// connection is lost: the call fails (see [`McpError::Lost`](crate::McpError::Lost)) and the
    /// next call connects again. Without it a call would wait forever for a server that went away
    /// mid-call (rmcp leaves such a request pending). A stdio server needs none: its exit closes
    /// the stream at once.
    pub fn ping_every(mut self, every: Duration) -> Self {
        self.ping = every;
        self
    }

    /// How long connecting may take: starting the process (stdio) or reaching the URL (HTTP), and
    /// MCP's `initialize` handshake (30 s by default; zero: no limit). Past it the connection fails
    /// with [`ErrorKind::Timeout`](tower_agent_core::ErrorKind::Timeout) and an
    /// [`McpError::Timeout`](crate::McpError::Timeout) source. It applies to every connection: at
    /// [`McpTools::connect`](crate::McpTools::connect), and when a call connects again. A first
    /// `npx -y` may download the server: give it longer.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long listing the server's tools (`tools/list`, every page) may take (30 s by default;
    /// zero: no limit). Past it the listing fails with
    /// [`ErrorKind::Timeout`](tower_agent_core::ErrorKind::Timeout) and an
    /// [`McpError::Timeout`](crate::McpError::Timeout) source; a connection whose tools cannot be
    /// listed is not used.
    pub fn list_timeout(mut self, timeout: Duration) -> Self {
        self.list_timeout = timeout;
        self
    }

    /// Whether [`McpTools::connect`](crate::McpTools::connect) (and
    /// [`refresh`](crate::McpTools::refresh)) fail when this server cannot be connected
    /// (`false` by default: its tools are left out, a warning goes to `tracing`, and
    /// [`McpTools::unavailable`](crate::McpTools::unavailable) names it).
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// Whether the agent acts on the server's tool hints (`false` by default). MCP's
    /// annotations are the server's own claims, to be trusted only from a trusted server:
    /// trusted, `readOnlyHint` makes a tool [`read_only`](tower_agent_core::ToolSpec::read_only)
    /// (its calls may start early) and `idempotentHint`
    /// [`idempotent`](tower_agent_core::ToolSpec::idempotent), and a call of either whose
    /// answer was lost with the connection is sent once more, with the same key. Untrusted,
    /// the hints are only read ([`McpTools::annotations`](crate::McpTools::annotations)).
    pub fn trust_hints(mut self, trust: bool) -> Self {
        self.trust_hints = trust;
        self
    }

    /// Whether the server must be connected.
    pub(crate) fn is_required(&self) -> bool {
        self.required
    }

    /// The ping interval while a call waits: HTTP only (a child process that exits closes
    /// its stream at once, and one busy with a call may not answer a ping), never when zero.
    pub(crate) fn ping(&self) -> Option<Duration> {
        match self.transport {
            Transport::Http { .. } if !self.ping.is_zero() => Some(self.ping),
            _ => None,
        }
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("McpServer");
        out.field("name", &self.name);
        match &self.transport {
            Transport::Stdio {
                program, args, env, ..
            } => out
                .field("program", program)
                .field("args", args)
                .field("env", &env.iter().map(|(k, _)| k).collect::<Vec<_>>()),
            Transport::Http { url, bearer } => out
                .field("url", url)
                .field("bearer", &bearer.as_ref().map(|_| "<redacted>")),
        };
        out.finish()
    }
}
