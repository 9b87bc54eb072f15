//! OpenTelemetry export over OTLP/HTTP (feature `otel`): the agent's spans and the providers'
//! GenAI metrics, to any collector or trace viewer (Jaeger, Arize Phoenix, Grafana Tempo, an
//! OpenTelemetry Collector).
//!
//! The agent and the providers speak `tracing`; this module is the bridge: [`Otlp`] builds a
//! tracer provider and a meter provider that export over OTLP/HTTP (protobuf), sets the meter
//! provider as the global one (the providers record their metrics there), and hands a
//! `tracing` layer ([`Telemetry::layer`]) that turns the spans into OpenTelemetry spans.
//!
//! ```no_run
//! use tower_agent::otel::Otlp;
//! use tracing_subscriber::filter::LevelFilter;
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//!
//! # fn main() -> Result<(), tower_agent::Error> {
//! let telemetry = Otlp::http("http://127.0.0.1:4318")
//!     .service_name("weather-agent")
//!     .start()?;
//! tracing_subscriber::registry()
//!     .with(telemetry.layer())
//!     .with(LevelFilter::INFO) // the HTTP clients' debug lines would become span events
//!     .init();
//!
//! // ... build the agent and run it ...
//!
//! telemetry.shutdown()?; // exports what is left
//! # Ok(())
//! # }
//! ```
//!
//! What a run looks like (the names are those of the GenAI semantic conventions of 1.41.0):
//!
//! | span | from | attributes |
//! |---|---|---|
//! | `invoke_agent` | the agent, one per run | `gen_ai.conversation.id` (the session), `run_id`, the run's `gen_ai.usage.*_tokens` (a failed run's too), `error.type` and status error on failure |
//! | `model` | the agent, one per round | `round`: every model layer's work (retries, a summarizer's calls) |
//! | `chat {model}` | a provider, one per HTTP call | `gen_ai.provider.name`, `gen_ai.request.model`, `server.address`, tokens, finish reasons, `error.type`; the messages with `capture_content` |
//! | `execute_tool {tool}` | the agent, one per tool call | `gen_ai.operation.name`, `gen_ai.tool.name`, `gen_ai.tool.call.id`; `error.type` (`tool_error` for an error result, `panic`, `cancelled`, or the failure's kind) and status error |
//!
//! The metrics (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`) come from
//! the providers built with their `otel` feature, which this feature turns on.

use std::collections::HashMap;
use std::fmt;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tower_agent_core::{Error, SEMCONV_SCHEMA_URL};
use tracing_opentelemetry::OpenTelemetryLayer;

pub use opentelemetry;
pub use opentelemetry_otlp;
pub use opentelemetry_sdk;
pub use tracing_opentelemetry;

/// Where and how to export: an OTLP/HTTP endpoint, its headers, the resource, whether to
/// send metrics.
#[derive(Clone)]
pub struct Otlp {
    endpoint: String,
    headers: HashMap<String, String>,
    service_name: String,
    resource: Vec<KeyValue>,
    metrics: bool,
}

/// The endpoint without credentials in its authority, the headers' names only.
impl fmt::Debug for Otlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoint = match self.endpoint.split_once("://") {
            Some((scheme, rest)) => match rest.split_once('@') {
                Some((_, host)) => format!("{scheme}://{host}"),
                None => self.endpoint.clone(),
            },
            None => self.endpoint.clone(),
        };
        let mut headers: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        headers.sort_unstable();
        f.debug_struct("Otlp")
            .field("endpoint", &endpoint)
            .field("headers", &headers)
            .field("service_name", &self.service_name)
            .field("resource", &self.resource)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl Otlp {
    /// Export to the OTLP/HTTP receiver at `endpoint` (`http://127.0.0.1:4318`; Phoenix's is
    /// `http://127.0.0.1:6006`): spans to `{endpoint}/v1/traces`, metrics to
    /// `{endpoint}/v1/metrics`.
    pub fn http(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into().trim_end_matches('/').to_owned(),
            headers: HashMap::new(),
            service_name: "tower-agent".to_owned(),
            resource: Vec::new(),
            metrics: true,
        }
    }

    /// Send `name: value` with every export (a hosted backend's key). The value never shows
    /// in `Debug`.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The resource's `service.name` (`tower-agent` by default).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// Another attribute of the resource: `deployment.environment.name`, or Phoenix's
    /// `openinference.project.name` to pick the project the traces go to.
    pub fn resource(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.resource.push(KeyValue::new(key, value));
        self
    }

    /// Send metrics too (the default), or not: a trace viewer without a metrics receiver
    /// (Phoenix) would refuse them.
    pub fn metrics(mut self, metrics: bool) -> Self {
        self.metrics = metrics;
        self
    }

    /// Build the exporters and the providers, and make the meter provider the global one.
    /// The spans and metrics are sent in batches from threads of their own: no runtime is
    /// needed, and an unreachable receiver slows nothing down.
    ///
    /// # Errors
    ///
    /// `BadRequest` when an exporter cannot be built (an endpoint that is not a URL).
    pub fn start(self) -> Result<Telemetry, Error> {
        let resource = Resource::builder()
            .with_service_name(self.service_name)
            .with_attributes(self.resource)
            .build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", self.endpoint))
            .with_headers(self.headers.clone())
            .build()
            .map_err(build_error)?;
        let traces = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let metrics = if self.metrics {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/metrics", self.endpoint))
                .with_headers(self.headers)
                .build()
                .map_err(build_error)?;
            let provider = SdkMeterProvider::builder()
                .with_periodic_exporter(exporter)
                .with_resource(resource)
                .build();
            opentelemetry::global::set_meter_provider(provider.clone());
            Some(provider)
        } else {
            None
        };
        Ok(Telemetry { traces, metrics })
    }
}

fn build_error(error: opentelemetry_otlp::ExporterBuildError) -> Error {
    Error::bad_request("the OTLP exporter could not be built").with_source(error)
}

/// The running export: the `tracing` layer of the spans, and the flush at the end.
#[derive(Debug)]
pub struct Telemetry {
    traces: SdkTracerProvider,
    metrics: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// The `tracing` layer that exports spans: add it to the host's subscriber.
    pub fn layer<S>(&self) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    {
        let scope = InstrumentationScope::builder("tower-agent")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(SEMCONV_SCHEMA_URL)
            .build();
        tracing_opentelemetry::layer().with_tracer(self.traces.tracer_with_scope(scope))
    }

    /// Export what is waiting now (the spans of the runs that ended, the metrics so far).
    ///
    /// # Errors
    ///
    /// `Backend` when the receiver refused them or could not be reached.
    pub fn flush(&self) -> Result<(), Error> {
        self.traces.force_flush().map_err(export_error)?;
        if let Some(metrics) = &self.metrics {
            metrics.force_flush().map_err(export_error)?;
        }
        Ok(())
    }

    /// Export what is left and stop.
    ///
    /// # Errors
    ///
    /// `Backend` when the receiver refused the last batch or could not be reached.
    pub fn shutdown(self) -> Result<(), Error> {
        let traces = self.traces.shutdown().map_err(export_error);
        let metrics = match &self.metrics {
            Some(metrics) => metrics.shutdown().map_err(export_error),
            None => Ok(()),
        };
        traces.and(metrics)
    }
}

fn export_error(error: opentelemetry_sdk::error::OTelSdkError) -> Error {
    Error::backend("the OTLP export failed").with_source(error)
}

#[cfg(test)]
mod tests {
    use tower_agent_core::ErrorKind;

    use super::*;

    #[test]
    fn spans_go_to_v1_traces_as_protobuf_with_the_headers() {
        use std::io::{BufRead, BufReader, Read, Write};
        use tracing_subscriber::layer::SubscriberExt;

        // A receiver of one request: its head is kept, then 200.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let receiver = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("a connection");
            let mut reader = BufReader::new(stream);
            let mut head = Vec::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("a line");
                if line.trim().is_empty() {
                    break;
                }
                if let Some(value) = line.to_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().expect("a length");
                }
                head.push(line.trim().to_owned());
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("the body");
            let mut stream = reader.into_inner();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .expect("answered");
            (head, body)
        });
        let telemetry = Otlp::http(format!("http://127.0.0.1:{port}"))
            .header("x-api-key", "k-123")
            .metrics(false)
            .start()
            .expect("built");
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("invoke_agent").in_scope(|| {});
        });
        telemetry.flush().expect("exported");
        let (head, body) = receiver.join().expect("received");
        assert!(head[0].starts_with("POST /v1/traces "), "{head:?}");
        let has = |header: &str| head.iter().any(|line| line.to_lowercase() == header);
        assert!(has("content-type: application/x-protobuf"), "{head:?}");
        assert!(has("x-api-key: k-123"), "{head:?}");
        // The span's name and the scope are in the protobuf body.
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains("invoke_agent") && body.contains("tower-agent"),
            "{body}"
        );
    }

    #[test]
    fn debug_shows_no_credentials() {
        let otlp = Otlp::http("https://user:hunter2-password@otlp.example.com")
            .header("authorization", "Bearer secret-token-value");
        let debug = format!("{otlp:?}");
        assert!(debug.contains("https://otlp.example.com"), "{debug}");
        assert!(debug.contains("authorization"), "{debug}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("secret-token"),
            "{debug}"
        );
    }

    #[test]
    fn an_endpoint_that_is_not_a_url_is_a_bad_request() {
        let error = Otlp::http("http://[::1")
            .metrics(false)
            .start()
            .expect_err("no URL");
        assert_eq!(error.kind(), ErrorKind::BadRequest);
    }

    #[test]
    fn a_receiver_that_cannot_be_reached_fails_the_flush() {
        use tracing_subscriber::layer::SubscriberExt;

        // A port nobody listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let telemetry = Otlp::http(format!("http://127.0.0.1:{port}"))
            .metrics(false)
            .start()
            .expect("built");
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("invoke_agent").in_scope(|| {});
        });
        let error = telemetry.flush().expect_err("nobody receives");
        assert_eq!(error.kind(), ErrorKind::Backend);
    }
}
