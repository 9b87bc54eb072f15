//! The agent on a real Restate server, with real processes: `restate-server` (npm
//! `@restatedev/restate-server`, `RESTATE_SERVER` names the binary; `.ci/run` installs it) and
//! this test run as the agent's service (`DURABLE_CHILD`).
//!
//! - A service killed with SIGKILL in the middle of a tool call: Restate replays the run on a
//!   new process; the finished steps come from the journal (never run again), the one in flight
//!   is recovered (its write-ahead step is in the journal, its result is not: the tools are asked
//!   what became of it, and it never runs again), the run completes.
//! - The same while a run waits on a pause before its model call: answered over HTTP, the
//!   layer that paused reads the answer, the run completes.
//! - The Restate server killed while a run waits on an approval: restarted on its data, the
//!   awakeable resolved over HTTP, the approved call runs once, the run completes.
//! - A run cancelled through the admin API ends cancelled.
//! - Figures: the time per journaled step against the in-process agent (median and p99 over
//!   1,000 steps), and many runs at once on one service process.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tower::{Layer, ServiceExt};
use tower_agent_core::{
    AgentRequest, Error, Flow, Interrupt, Message, ModelRequest, ModelResponse, Recovery, Role,
    Session, ToolCall, before_model,
};
use tower_agent_layers::approval::{ApprovalLayer, Gate};
use tower_agent_loop::Agent;
use tower_agent_restate::restate_sdk::prelude::{Endpoint, HttpServer};
use tower_agent_restate::{BoxAgent, DurableAgent, JournalLayer};
use tower_agent_test::ScriptedModel;
use tower_agent_tools::{NoArgs, ToolContext, ToolSet, tool_fn};

/// How many service processes the crash test kills.
const KILLS: usize = 3;
/// Kill points of the exactly-once runs (`EXACTLY_ONCE_KILLS` to change).
const RESTATE_KILL_POINTS: u32 = 300;
/// Steps of the figure run: 500 rounds of one model call and one tool call.
const BENCH_ROUNDS: usize = 500;
/// Runs at once on one service process (`DURABLE_CONCURRENT` to try more).
const CONCURRENT: usize = 200;

fn main() {
    match std::env::var("DURABLE_CHILD") {
        Ok(mode) => child(&mode),
        Err(_) => parent(),
    }
}

fn log(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the log opens");
    writeln!(file, "{line}").expect("the log is written");
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The scripted model: what it does depends on the session's first message and on how many
/// tool results it has seen.
fn model() -> ScriptedModel {
    ScriptedModel::from_fn(|req| {
        let first = req.messages.first().map(|m| m.text()).unwrap_or_default();
        let results = req.messages.iter().filter(|m| m.role == Role::Tool).count();
        let call = |id: &str, name: &str| {
            Ok(ModelResponse::tool_calls([ToolCall::new(
                id,
                name,
                json!({}),
            )]))
        };
        match (first.as_str(), results) {
            ("crash", 0) => call("w1", "write"),
            ("pay", 0) => Ok(ModelResponse::tool_calls([
                ToolCall::new("p1", "pay", json!({})),
                ToolCall::new("p2", "pay", json!({})),
            ])),
            ("crash", 1) => call("s2", "slow"),
            ("approve", 0) => call("d1", "deploy"),
            ("cancel", 0) => call("h1", "hang"),
            ("hold", 0) => call("p1", "pause"),
            ("bench", n) if n < BENCH_ROUNDS => call(&format!("n{n}"), "noop"),
            _ => Ok(ModelResponse::text("finished")),
        }
        .inspect(|_| {
            if first == "bench" {
                stamp();
            }
        })
    })
    .without_recording()
}

/// Where the figure run writes when each step ran (microseconds since the process started).
static TIMES: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn stamp() {
    if let Some(path) = TIMES.get() {
        log(path, &started().elapsed().as_micros().to_string());
    }
}

fn started() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// The agent of the service: approval on `deploy`, the journal innermost on both stacks.
fn agent(effects: PathBuf, slow_finishes: bool) -> BoxAgent {
    let logged = |name: &'static str, effects: PathBuf| {
        tool_fn(name, "Logs its call.", move |_: NoArgs, tc: ToolContext| {
            log(&effects, &format!("{name} {}", tc.call().id));
            async move { Ok::<_, Error>(format!("{name} done")) }
        })
    };
    let slow_log = effects.clone();
    let slow = tool_fn("slow", "Slow.", move |_: NoArgs, tc: ToolContext| {
        log(&slow_log, &format!("slow {} started", tc.call().id));
        async move {
            if !slow_finishes {
                tokio::time::sleep(Duration::from_secs(600)).await; // killed meanwhile
            }
            Ok::<_, Error>("slow done")
        }
    });
    let hang_log = effects.clone();
    let hang = tool_fn(
        "hang",
        "Hangs a while.",
        move |_: NoArgs, tc: ToolContext| {
            log(&hang_log, &format!("hang {} started", tc.call().id));
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok::<_, Error>("hang done")
            }
        },
    );
    let pause = tool_fn("pause", "Waits half a second.", |_: NoArgs| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, Error>("paused")
    });
    let noop = tool_fn("noop", "Does nothing.", |_: NoArgs| async {
        stamp();
        Ok::<_, Error>("ok")
    });
    // A payment: its effect is a ledger line with the call's key, a few milliseconds into
    // the call (the kill points fall around it); its reconcile step looks the key up.
    let (paid, looked) = (effects.clone(), effects.clone());
    let pay = tool_fn("pay", "Pays.", move |_: NoArgs, tc: ToolContext| {
        let (path, key) = (
            paid.clone(),
            tc.key().map(|k| k.to_string()).unwrap_or_default(),
        );
        let pause = u64::from(started().elapsed().subsec_micros() % 20);
        async move {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            log(&path, &format!("paid {key}"));
            tokio::time::sleep(Duration::from_millis(20 - pause)).await;
            Ok::<_, Error>(format!("paid {key}"))
        }
    })
    .reconcile(move |_: NoArgs, tc: ToolContext| {
        let line = format!(
            "paid {}",
            tc.key().map(|k| k.to_string()).unwrap_or_default()
        );
        let found = lines(&looked).contains(&line);
        async move {
            match found {
                true => Recovery::done(line),
                false => Recovery::NotRun,
            }
        }
    });
    let tools = ToolSet::new()
        .tool(pay)
        .tool(logged("write", effects.clone()))
        .tool(logged("deploy", effects))
        .tool(slow)
        .tool(hang)
        .tool(pause)
        .tool(noop);
    let approval = ApprovalLayer::builder()
        .gate("deploy", Gate::new())
        .build()
        .expect("a valid gate");
    let tools = approval.layer(JournalLayer.layer(tools));
    // A pause before the model call of a run that starts with "gate", until the host says go
    // (outside the journal: replayed, it asks the same and reads the journaled answer).
    let gate = before_model(|req: ModelRequest| async move {
        let gated = req.messages.first().is_some_and(|m| m.text() == "gate");
        Ok(
            match gated && req.ctx.resumed("spend") != Some(json!("go")) {
                true => Flow::Answer(ModelResponse::pause(Interrupt::before_model(
                    "spend",
                    "budget",
                    json!("Spend more?"),
                ))),
                false => Flow::Continue(req),
            },
        )
    });
    let agent = Agent::builder()
        .max_rounds(BENCH_ROUNDS as u32 + 10)
        .model_layer(gate)
        .build(JournalLayer.layer(model()), tools);
    BoxAgent::new(agent)
}

/// The agent's service process.
fn child(mode: &str) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let port: u16 = var("DURABLE_PORT").parse().expect("a port");
    let effects = PathBuf::from(var("DURABLE_LOG"));
    let _ = TIMES.set(PathBuf::from(var("DURABLE_TIMES")));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    started();
    runtime.block_on(async move {
        let agent = agent(effects, mode != "first");
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the port is free");
        HttpServer::new(Endpoint::builder().bind(DurableAgent::new(agent)).build())
            .serve(listener)
            .await;
    });
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_for_port(port: u16, process: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = process.try_wait().expect("waits") {
            panic!("{what} exited before listening: {status}");
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Restate server on loopback ports, on a data directory that outlives it.
struct Server {
    binary: PathBuf,
    data: PathBuf,
    ports: [u16; 3],
    process: Child,
}

impl Server {
    fn start(binary: &Path, data: &Path, ports: [u16; 3]) -> Server {
        let [fabric, admin, ingress] = ports;
        let process = Command::new(binary)
            .arg("--no-logo")
            .env("RESTATE_BASE_DIR", data)
            .env("RESTATE_NODE_NAME", "tower-agent-test")
            .env("RESTATE_LISTEN_MODE", "tcp")
            .env("RESTATE_BIND_IP", "127.0.0.1")
            .env("RESTATE_BIND_PORT", fabric.to_string())
            .env("RESTATE_ADMIN__BIND_ADDRESS", format!("127.0.0.1:{admin}"))
            .env(
                "RESTATE_INGRESS__BIND_ADDRESS",
                format!("127.0.0.1:{ingress}"),
            )
            .env("RESTATE_DEFAULT_NUM_PARTITIONS", "2")
            .env("RESTATE_DISABLE_TELEMETRY", "true")
            .env("RESTATE_DEFAULT_RETRY_POLICY__INITIAL_INTERVAL", "100ms")
            .env("RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL", "1s")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("restate-server starts");
        let mut server = Server {
            binary: binary.to_owned(),
            data: data.to_owned(),
            ports,
            process,
        };
        wait_for_port(admin, &mut server.process, "restate-server");
        wait_for_port(ingress, &mut server.process, "restate-server");
        server
    }

    fn admin(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[1])
    }

    fn ingress(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[2])
    }

    fn kill(&mut self) {
        self.process.kill().expect("kill -9");
        self.process.wait().expect("reaped");
    }

    fn restart(&mut self) {
        self.kill();
        *self = Server::start(&self.binary.clone(), &self.data.clone(), self.ports);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// One service process serving the agent on `port`.
struct Service {
    process: Child,
}

impl Service {
    fn start(mode: &str, port: u16, effects: &Path, times: &Path) -> Service {
        let mut process = Command::new(std::env::current_exe().expect("this test's path"))
            .env("DURABLE_CHILD", mode)
            .env("DURABLE_PORT", port.to_string())
            .env("DURABLE_LOG", effects)
            .env("DURABLE_TIMES", times)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the service starts");
        wait_for_port(port, &mut process, "the service");
        Service { process }
    }

    fn kill(&mut self) {
        self.process.kill().expect("kill -9");
        self.process.wait().expect("reaped");
    }

    /// The service's peak resident memory, in KiB.
    fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

struct Http {
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Http {
    fn send(&self, method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
        self.runtime.block_on(async {
            let mut request = self.client.request(method, url);
            if let Some(body) = body {
                request = request.json(&body);
            }
            let response = request.send().await.expect("the server answers");
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (
                status,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        })
    }

    /// Start a run of session `key` with `message`; its invocation id.
    fn start_run(&self, server: &Server, key: &str, message: &str) -> String {
        let url = format!("{}/Agent/{key}/run/send", server.ingress());
        let body = json!({ "message": message });
        // A server that just started may refuse for a moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        let sent = loop {
            let (status, sent) = self.send(reqwest::Method::POST, &url, Some(body.clone()));
            if (200..300).contains(&status) {
                break sent;
            }
            assert!(Instant::now() < deadline, "{url}: {status} {sent}");
            std::thread::sleep(Duration::from_millis(100));
        };
        sent["invocationId"]
            .as_str()
            .unwrap_or_else(|| panic!("an invocation id: {sent}"))
            .to_owned()
    }

    /// The run's result, waiting for it.
    fn result(&self, server: &Server, invocation: &str) -> (u16, Value) {
        let url = format!(
            "{}/restate/invocation/{invocation}/attach",
            server.ingress()
        );
        self.send(reqwest::Method::GET, &url, None)
    }
}

fn register(http: &Http, server: &Server, port: u16) {
    let url = format!("{}/deployments", server.admin());
    let body = json!({ "uri": format!("http://127.0.0.1:{port}"), "force": true });
    // The server answers on its ports a moment before it takes registrations.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = http.send(reqwest::Method::POST, &url, Some(body.clone()));
        if (200..300).contains(&status) {
            return;
        }
        assert!(Instant::now() < deadline, "register: {status} {answer}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for_line(path: &Path, line: &str, from: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lines(path)[from.min(lines(path).len())..]
        .iter()
        .any(|l| l == line)
    {
        assert!(Instant::now() < deadline, "`{line}` never logged");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start a run of `key` with `message`, wait until it waits on an awakeable, kill and restart
/// the server, resolve the awakeable with `answer`, and wait for the run to answer "finished":
/// what waited, and the session stored then (its history valid).
fn wait_restart_answer(
    http: &Http,
    server: &mut Server,
    key: &str,
    message: &str,
    answer: Value,
) -> (Value, Session) {
    let invocation = http.start_run(server, key, message);
    let pending_url = format!("{}/Agent/{key}/pending", server.ingress());
    let deadline = Instant::now() + Duration::from_secs(30);
    let (awakeable, waited) = loop {
        let (_, pending) = http.send(reqwest::Method::POST, &pending_url, None);
        if let Some(id) = pending[0]["awakeable"].as_str() {
            break (id.to_owned(), pending[0].clone());
        }
        assert!(Instant::now() < deadline, "the run never waited: {pending}");
        std::thread::sleep(Duration::from_millis(50));
    };
    server.restart();
    let resolve = format!(
        "{}/restate/awakeables/{awakeable}/resolve",
        server.ingress()
    );
    // The restarted server takes a moment to lead its partitions again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = http.send(reqwest::Method::POST, &resolve, Some(answer.clone()));
        if (200..300).contains(&status) {
            break;
        }
        assert!(Instant::now() < deadline, "resolve: {status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, result) = http.result(server, &invocation);
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["text"], "finished", "{result}");
    let (_, session) = http.send(
        reqwest::Method::POST,
        &format!("{}/Agent/{key}/session", server.ingress()),
        None,
    );
    let session: Session = serde_json::from_value(session).expect("a session");
    session.history.validate().expect("a valid history");
    (waited, session)
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn parent() {
    let Ok(binary) = std::env::var("RESTATE_SERVER") else {
        assert!(
            std::env::var("CI").is_err(),
            "RESTATE_SERVER is not set: .ci/run installs restate-server from npm and exports it"
        );
        eprintln!("skipped: RESTATE_SERVER is not set (the restate-server binary)");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let effects = dir.path().join("effects.log");
    let times = dir.path().join("times.log");
    let http = Http {
        // No kept connection: a restarted server is a new one.
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("a client"),
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
    };
    let ports = [free_port(), free_port(), free_port()];
    let started = Instant::now();
    let mut server = Server::start(Path::new(&binary), &dir.path().join("restate"), ports);
    println!(
        "restate-server ready in {} ms",
        started.elapsed().as_millis()
    );
    let port = free_port();
    let mut service = Service::start("first", port, &effects, &times);
    register(&http, &server, port);

    // 1. The service killed with SIGKILL mid-tool-call, KILLS times.
    for kill in 0..KILLS {
        let key = format!("crash-{kill}");
        let from = lines(&effects).len();
        let invocation = http.start_run(&server, &key, "crash");
        wait_for_line(&effects, "slow s2 started", from);
        service.kill();
        service = Service::start("replay", port, &effects, &times);
        let (status, result) = http.result(&server, &invocation);
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["outcome"], "completed", "{result}");
        assert_eq!(result["text"], "finished", "{result}");
        let ran = lines(&effects)[from..].to_vec();
        assert_eq!(
            ran.iter().filter(|l| *l == "write w1").count(),
            1,
            "the journaled call never runs again: {ran:?}"
        );
        let slow = ran.iter().filter(|l| *l == "slow s2 started").count();
        assert_eq!(
            slow, 1,
            "the call in flight is recovered on the replay, never run again: {ran:?}"
        );
        // The next crash kills a process that hangs in the slow tool again.
        service.kill();
        service = Service::start("first", port, &effects, &times);
    }
    println!(
        "crash: {KILLS} service processes killed with SIGKILL mid-tool-call, {KILLS} runs \
         replayed and completed; journaled calls run again: 0; calls in flight run again: 0 \
         (recovered)"
    );

    // 1b. Exactly once over many kill points: runs of two payments, the service killed with
    // SIGKILL at random points (up to three times a run), each run replayed to completion.
    let (mut kills, mut runs, mut effect_count, mut not_run) = (0, 0, 0, 0);
    let kill_points = std::env::var("EXACTLY_ONCE_KILLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(RESTATE_KILL_POINTS);
    let mut random = started.elapsed().as_nanos() as u64 | 1;
    let mut below = |n: u64| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % n.max(1)
    };
    let payments = Instant::now();
    while kills < kill_points {
        let key = format!("pay-{runs}");
        runs += 1;
        let from = lines(&effects).len();
        let invocation = http.start_run(&server, &key, "pay");
        for _ in 0..=below(3) {
            std::thread::sleep(Duration::from_millis(below(60)));
            service.kill();
            kills += 1;
            service = Service::start("replay", port, &effects, &times);
        }
        let (status, result) = http.result(&server, &invocation);
        assert_eq!(status, 200, "{result}");
        assert_eq!(result["text"], "finished", "{result}");
        let (_, session) = http.send(
            reqwest::Method::POST,
            &format!("{}/Agent/{key}/session", server.ingress()),
            None,
        );
        let session: Session = serde_json::from_value(session).expect("a session");
        session.history.validate().expect("a valid history");
        let ledger: Vec<String> = lines(&effects)[from..]
            .iter()
            .filter(|l| l.starts_with("paid "))
            .cloned()
            .collect();
        let mut once = ledger.clone();
        once.sort();
        once.dedup();
        assert_eq!(
            once.len(),
            ledger.len(),
            "{key}: an effect twice: {ledger:?}"
        );
        for call in session.history.iter().flat_map(Message::tool_calls) {
            let line = format!("paid {}", call.key.expect("a key"));
            let result = session
                .history
                .iter()
                .flat_map(Message::tool_results)
                .find(|r| r.call_id == call.id)
                .expect("answered");
            match ledger.contains(&line) {
                true => {
                    assert_eq!(
                        result.content, line,
                        "{key}: the effect is lost from the session"
                    );
                    effect_count += 1;
                }
                false => {
                    // Only a recovery says "not run": the service died before the effect.
                    assert_eq!(
                        result.content,
                        tower_agent_core::ToolResult::NOT_RUN,
                        "{key}: a result without its effect"
                    );
                    not_run += 1;
                }
            }
        }
        assert_eq!(
            session.history.iter().flat_map(Message::tool_calls).count(),
            2,
            "{key}: two payments"
        );
        let shown = ledger
            .iter()
            .filter(|line| {
                session
                    .history
                    .iter()
                    .flat_map(Message::tool_results)
                    .any(|r| &r.content == *line)
            })
            .count();
        assert_eq!(
            shown,
            ledger.len(),
            "{key}: an effect of no call of the session"
        );
    }
    println!(
        "exactly once on Restate: {kills} kill points (SIGKILL of the service) over {runs} runs, \
         each replayed to completion; {effect_count} effects, 0 duplicated, 0 lost; {not_run} \
         calls recovered as not run (killed before their effect); {:.1} s",
        payments.elapsed().as_secs_f64()
    );

    // 2. The server killed while a run waits on an approval.
    let from = lines(&effects).len();
    let (pending, session) = wait_restart_answer(
        &http,
        &mut server,
        "ops-1",
        "approve",
        json!({ "type": "approve" }),
    );
    assert_eq!(pending["call"]["name"], "deploy", "{pending}");
    let ran = lines(&effects)[from..].to_vec();
    assert_eq!(ran, ["deploy d1"], "the approved call ran once");
    assert!(session.interrupts.is_empty());
    println!(
        "approval: the server killed with SIGKILL while a run waited; restarted, approved over HTTP, completed"
    );

    // 2b. The server killed while a run waits on a pause before its model call.
    let (pending, session) = wait_restart_answer(&http, &mut server, "gate-1", "gate", json!("go"));
    assert_eq!(pending["call"]["id"], "spend", "{pending}");
    assert_eq!(pending["before_model"], true, "{pending}");
    assert!(session.interrupts.is_empty());
    assert_eq!(
        session.history.len(),
        2,
        "the input and the answer: {session:?}"
    );
    println!(
        "pause before a model call: the server killed with SIGKILL while a run waited; restarted, answered over HTTP, completed"
    );

    // 3. Cancelling the invocation cancels the run.
    let from = lines(&effects).len();
    let invocation = http.start_run(&server, "cancel-1", "cancel");
    wait_for_line(&effects, "hang h1 started", from);
    let cancel = format!("{}/invocations/{invocation}/cancel", server.admin());
    let (status, answer) = http.send(reqwest::Method::PATCH, &cancel, None);
    assert!((200..300).contains(&status), "cancel: {status} {answer}");
    let (status, result) = http.result(&server, &invocation);
    assert_eq!(
        (status, result["outcome"].as_str()),
        (200, Some("cancelled")),
        "{result}"
    );
    println!("cancel: the run ended cancelled ({status})");

    // 4. The time per journaled step, against the in-process agent.
    let _ = std::fs::remove_file(&times);
    let invocation = http.start_run(&server, "bench-1", "bench");
    let (status, result) = http.result(&server, &invocation);
    assert_eq!(
        (status, result["outcome"].as_str()),
        (200, Some("completed")),
        "{result}"
    );
    let stamps: Vec<u128> = lines(&times)
        .iter()
        .filter_map(|l| l.parse().ok())
        .collect();
    let mut durable: Vec<u128> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
    durable.sort_unstable();
    let _ = std::fs::remove_file(&times);
    // The same agent in this process, without Restate.
    let _ = TIMES.set(times.clone());
    let local = agent(effects.clone(), true);
    http.runtime
        .block_on(local.oneshot(AgentRequest::new(Session::with_id("local"), "bench")))
        .expect("runs");
    let stamps: Vec<u128> = lines(&times)
        .iter()
        .filter_map(|l| l.parse().ok())
        .collect();
    let mut local: Vec<u128> = stamps.windows(2).map(|w| w[1] - w[0]).collect();
    local.sort_unstable();
    println!(
        "per step (a model or a tool call) over {} steps: durable median {} µs, p99 {} µs; \
         in-process median {} µs, p99 {} µs",
        durable.len(),
        percentile(&durable, 0.5),
        percentile(&durable, 0.99),
        percentile(&local, 0.5),
        percentile(&local, 0.99),
    );

    // 5. `{}` on a fresh key: nothing to continue, refused before any model call, nothing
    // stored.
    let (status, answer) = http.send(
        reqwest::Method::POST,
        &format!("{}/Agent/fresh-1/run", server.ingress()),
        Some(json!({})),
    );
    assert_eq!(status, 400, "{answer}");
    let (_, stored) = http.send(
        reqwest::Method::POST,
        &format!("{}/Agent/fresh-1/session", server.ingress()),
        None,
    );
    assert!(stored.is_null(), "nothing stored: {stored}");
    println!("continue on a fresh key: refused with {status}, nothing stored");

    // 6. Many runs at once on one service process.
    let concurrent = std::env::var("DURABLE_CONCURRENT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CONCURRENT);
    let started = Instant::now();
    let invocations: Vec<String> = (0..concurrent)
        .map(|n| http.start_run(&server, &format!("hold-{n}"), "hold"))
        .collect();
    for invocation in &invocations {
        let (status, result) = http.result(&server, invocation);
        assert_eq!(
            (status, result["outcome"].as_str()),
            (200, Some("completed")),
            "{result}"
        );
    }
    println!(
        "concurrent: {concurrent} runs (each a 0.5 s tool call) done in {} ms on one service process, \
         its peak memory {} MiB",
        started.elapsed().as_millis(),
        service.peak_kib() / 1024
    );
}
