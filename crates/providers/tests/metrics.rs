//! The GenAI client metrics of a provider call (feature `otel`), read back from an in-memory
//! exporter. Alone in its test binary: the meter provider is the process's global one.

#![cfg(all(feature = "otel", feature = "openai"))]

mod common;

use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, HistogramDataPoint, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tower_agent_core::{ErrorKind, Message, ModelRequest};
use tower_agent_providers::OpenAi;

use common::{Canned, Server, call};

/// One point of a histogram, its attributes as strings.
#[derive(Debug)]
struct Point {
    attributes: Vec<(String, String)>,
    count: u64,
    sum: f64,
    bounds: Vec<f64>,
    unit: String,
}

/// A histogram's points, by name.
fn points(exporter: &InMemoryMetricExporter, name: &str) -> Vec<Point> {
    let mut out = Vec::new();
    let exported = exporter.get_finished_metrics().expect("metrics");
    for resource in &exported {
        for scope in resource.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                assert_eq!(
                    scope.scope().schema_url(),
                    Some("https://opentelemetry.io/schemas/1.41.0")
                );
                let unit = metric.unit().to_owned();
                let mut push = |attributes, count, sum, bounds| {
                    out.push(Point {
                        attributes,
                        count,
                        sum,
                        bounds,
                        unit: unit.clone(),
                    });
                };
                fn attributes<T>(point: &HistogramDataPoint<T>) -> Vec<(String, String)> {
                    let mut all: Vec<(String, String)> = point
                        .attributes()
                        .map(|KeyValue { key, value, .. }| (key.to_string(), string(value)))
                        .collect();
                    all.sort();
                    all
                }
                match metric.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            push(attributes(p), p.count(), p.sum(), p.bounds().collect());
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            push(
                                attributes(p),
                                p.count(),
                                p.sum() as f64,
                                p.bounds().collect(),
                            );
                        }
                    }
                    _ => panic!("{name} is not a histogram"),
                }
            }
        }
    }
    out
}

fn string(value: &Value) -> String {
    value.as_str().into_owned()
}

fn has(attributes: &[(String, String)], key: &str, value: &str) -> bool {
    attributes.iter().any(|(k, v)| k == key && v == value)
}

#[tokio::test]
async fn each_call_records_its_duration_and_tokens() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());

    let server = Server::start([
        Canned::fixture("openai/text.json"),
        Canned::json(429, include_str!("fixtures/openai/rate_limited.json")),
    ])
    .await;
    let model = OpenAi::new("gpt-4o-mini")
        .base_url(format!("{}/v1", server.url))
        .api_key("sk-test-0123456789")
        .streaming(false);
    let request = || ModelRequest::new(vec![Message::user("The capital of France?")]);
    call(model.clone(), request()).await.expect("answered");
    let refused = call(model, request()).await.expect_err("rate limited");
    assert!(matches!(refused.kind(), ErrorKind::RateLimited { .. }));
    provider.force_flush().expect("flushed");

    let port = server.url.rsplit(':').next().expect("a port").to_owned();
    let durations = points(&exporter, "gen_ai.client.operation.duration");
    assert_eq!(durations.len(), 2, "one point per outcome: {durations:?}");
    for Point {
        attributes,
        count,
        sum,
        bounds,
        unit,
    } in &durations
    {
        assert_eq!(*count, 1);
        assert!(*sum > 0.0 && *sum < 10.0, "seconds: {sum}");
        assert_eq!(unit, "s");
        assert_eq!(bounds.first(), Some(&0.01));
        assert_eq!(bounds.last(), Some(&81.92));
        assert!(has(attributes, "gen_ai.operation.name", "chat"));
        assert!(has(attributes, "gen_ai.provider.name", "openai"));
        assert!(has(attributes, "gen_ai.request.model", "gpt-4o-mini"));
        assert!(has(attributes, "server.address", "127.0.0.1"));
        assert!(has(attributes, "server.port", &port));
    }
    let failed: Vec<_> = durations
        .iter()
        .filter(|point| point.attributes.iter().any(|(k, _)| k == "error.type"))
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(has(&failed[0].attributes, "error.type", "rate_limited"));

    // Tokens of the answered call only: 24 in, 8 out (the fixture's usage).
    let tokens = points(&exporter, "gen_ai.client.token.usage");
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    for (kind, expected) in [("input", 24.0), ("output", 8.0)] {
        let point = tokens
            .iter()
            .find(|point| has(&point.attributes, "gen_ai.token.type", kind))
            .unwrap_or_else(|| panic!("no {kind} tokens"));
        assert_eq!((point.count, point.sum), (1, expected), "{kind}");
        assert_eq!(point.unit, "{token}");
        assert_eq!(point.bounds.len(), 14);
        assert!(has(&point.attributes, "gen_ai.provider.name", "openai"));
        assert!(!point.attributes.iter().any(|(k, _)| k == "error.type"));
    }
}
