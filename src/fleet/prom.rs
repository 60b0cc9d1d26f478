//! A small client of Prometheus's HTTP API (`/api/v1/query`,
//! `/api/v1/query_range`) over plain HTTP, through hyper. Every failure is
//! one line naming what failed: the server unreachable, a query refused
//! (Prometheus's own message), an answer that is not what the API
//! documents. Answers are bounded ([`MAX_ANSWER`]) and so is each query's
//! time.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

/// The largest answer read (256 nodes × 8 GPUs × a few jobs is a few MiB).
pub const MAX_ANSWER: usize = 64 << 20;

/// One series' labels and one value (an instant query's answer).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// A label's value, "" when absent (as Prometheus treats it).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// One series over time (a range query's answer): (unix seconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// Where Prometheus is: `http://host:port[/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://host:port/prefix` without a trailing slash.
    base: String,
}

impl Endpoint {
    /// Parses `--prometheus URL`: http only, a host, no query or fragment.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = if let Some(r) = url.strip_prefix("http://") {
            r
        } else if url.starts_with("https://") {
            return Err(format!(
                "{url}: https is not supported; give Prometheus's plain http address (or one a local tunnel serves)"
            ));
        } else if !url.contains("://") {
            url
        } else {
            return Err(format!("{url}: not an http:// address"));
        };
        let rest = rest.trim_end_matches('/');
        let host = rest.split('/').next().unwrap_or("");
        if host.is_empty() || rest.contains(['?', '#', ' ']) || url.len() > 2048 {
            return Err(format!(
                "{url}: not an address of the form http://HOST:PORT[/PATH]"
            ));
        }
        let base = format!("http://{rest}");
        base.parse::<hyper::Uri>()
            .map_err(|e| format!("{url}: {e}"))?;
        Ok(Endpoint { base })
    }

    pub fn url(&self) -> &str {
        &self.base
    }
}

/// A Prometheus HTTP API client.
#[derive(Clone)]
pub struct Client {
    endpoint: Endpoint,
    http: HyperClient<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

/// Percent-encodes a query parameter's value.
fn encode(s: &str) -> String {
    let mut o = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    /// A vector's or a matrix's series (read in one pass; a scalar or a
    /// string answer is not a list of series, and is refused as such).
    result: Vec<RawSeries>,
}

/// One series of a vector (`value`) or a matrix (`values`).
#[derive(Deserialize)]
struct RawSeries {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(f64, String)>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

/// Prometheus writes values as strings ("NaN", "+Inf" included).
fn number(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ => s.parse::<f64>().map_err(|_| {
            format!(
                "a value is not a number: {:?}",
                crate::ring::layout::printable(s)
            )
        }),
    }
}

impl Client {
    pub fn new(endpoint: Endpoint, timeout: Duration) -> Client {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(timeout));
        conn.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(conn);
        Client {
            endpoint,
            http,
            timeout,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// GET `path?params` and the API's `data`.
    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Data, String> {
        let q: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let url = format!("{}{path}?{}", self.endpoint.base, q.join("&"));
        let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let base = &self.endpoint.base;
        let fetch = async {
            let resp =
                self.http.get(uri).await.map_err(|e| {
                    format!("Prometheus at {base} cannot be reached: {}", cause(&e))
                })?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("Prometheus at {base}: reading its answer failed: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, fetch)
            .await
            .map_err(|_| {
                format!(
                    "Prometheus at {base} did not answer within {} s",
                    self.timeout.as_secs()
                )
            })??;
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            format!(
                "Prometheus at {base} answered HTTP {} with something that is not its API's JSON ({e})",
                status.as_u16()
            )
        })?;
        if answer.status != "success" {
            return Err(format!(
                "Prometheus refused a query: {}{}",
                answer
                    .error_type
                    .map(|t| format!("{t}: "))
                    .unwrap_or_default(),
                crate::ring::layout::printable(&answer.error.unwrap_or_default())
            ));
        }
        answer
            .data
            .ok_or_else(|| format!("Prometheus at {base}: a successful answer without data"))
    }

    /// An instant query: one value per series.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, String> {
        let data = self
            .get("/api/v1/query", &[("query", promql.to_string())])
            .await?;
        if data.result_type != "vector" {
            return Err(format!(
                "Prometheus answered a {} where a vector was asked for",
                data.result_type
            ));
        }
        data.result
            .into_iter()
            .map(|r| {
                let (_, v) = r
                    .value
                    .ok_or("Prometheus's vector has a series without a value")?;
                Ok(Sample {
                    labels: printable_labels(r.metric),
                    value: number(&v)?,
                })
            })
            .collect()
    }

    /// A range query from `start` to `end` (unix seconds) every `step` s.
    pub async fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, String> {
        let data = self
            .get(
                "/api/v1/query_range",
                &[
                    ("query", promql.to_string()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", format!("{step:.3}")),
                ],
            )
            .await?;
        if data.result_type != "matrix" {
            return Err(format!(
                "Prometheus answered a {} where a matrix was asked for",
                data.result_type
            ));
        }
        data.result
            .into_iter()
            .map(|r| {
                let points = r
                    .values
                    .iter()
                    .map(|(t, v)| Ok((*t, number(v)?)))
                    .collect::<Result<_, String>>()?;
                Ok(Series {
                    labels: printable_labels(r.metric),
                    points,
                })
            })
            .collect()
    }
}

/// Labels from another machine, made safe to show.
fn printable_labels(m: BTreeMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter()
        .map(|(k, v)| {
            (
                crate::ring::layout::printable(&k),
                crate::ring::layout::printable(&v),
            )
        })
        .collect()
}

/// The innermost cause of a client error (hyper's outer text is generic).
fn cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner: &dyn std::error::Error = e;
    while let Some(s) = inner.source() {
        inner = s;
    }
    inner.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        assert_eq!(
            Endpoint::parse("http://prom:9090/").unwrap().url(),
            "http://prom:9090"
        );
        assert_eq!(
            Endpoint::parse("localhost:9090").unwrap().url(),
            "http://localhost:9090"
        );
        assert_eq!(
            Endpoint::parse("http://h/prometheus").unwrap().url(),
            "http://h/prometheus"
        );
        assert!(Endpoint::parse("https://h").unwrap_err().contains("https"));
        for bad in ["ftp://h", "http://", "http://h?x=1", "http://h x"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(encode("up{job=\"a b\"}"), "up%7Bjob%3D%22a%20b%22%7D");
        assert_eq!(number("+Inf").unwrap(), f64::INFINITY);
        assert!(number("NaN").unwrap().is_nan());
        assert!(number("x").is_err());
    }
}
