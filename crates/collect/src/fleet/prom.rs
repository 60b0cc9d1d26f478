//! A small client of Prometheus's HTTP API (`/api/v1/query`,
//! `/api/v1/query_range`) over plain HTTP, through hyper. Every failure is
//! one line naming what failed: the server unreachable, a query refused
//! (Prometheus's own message), an answer that is not what the API
//! documents. Answers are bounded ([`MAX_ANSWER`]) and so is each query's
//! time.
//!
//! The boundary for what comes from another machine (an exporter, through
//! Prometheus, or Prometheus itself): an answer holds at most
//! [`MAX_SERIES`] series of at most [`MAX_LABELS`] labels and
//! [`MAX_POINTS`] points (else it is refused, one line), so reading one
//! takes memory and time in proportion to its size; and every value and
//! timestamp past it is finite and within ±[`LARGEST`]: a point or sample
//! with `NaN`, `±Inf` or a larger value is dropped here, as if absent, so
//! that nothing downstream (sums, sorting, the chart's scaling) meets one.
//! The answer is read off the runtime's worker thread.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

/// The largest answer read (256 nodes × 8 GPUs × a few jobs is a few MiB).
pub(crate) const MAX_ANSWER: usize = 64 << 20;

/// The most series an answer may hold (a fleet of 256 nodes of 8 GPUs and 8
/// jobs each is about 33,000 in the figures query).
pub const MAX_SERIES: usize = 250_000;

/// The most labels a series may have (an exporter's have at most 15).
pub const MAX_LABELS: usize = 64;

/// The most points a series of a range query may have (Prometheus's own
/// limit for one query; the fleet view asks for about 240).
pub const MAX_POINTS: usize = 11_000;

/// The largest magnitude kept of a value or timestamp: 2^64, past every
/// figure an exporter writes (its figures are u64).
pub const LARGEST: f64 = 18_446_744_073_709_551_616.0;

/// `v` if it is finite and within ±[`LARGEST`], else nothing.
pub(crate) fn usable(v: f64) -> Option<f64> {
    (v.is_finite() && v.abs() <= LARGEST).then_some(v)
}

/// A series' labels, made printable, in one string (`name\0value\0…`,
/// sorted by name): they take about the room of their text, however many
/// series there are (a map per series took ten times an answer's size).
/// `printable` leaves no NUL in a name or value, so the separator is
/// unambiguous.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Labels(Box<str>);

impl Labels {
    /// The value of label `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    /// (name, value), by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut parts = self.0.split('\0');
        std::iter::from_fn(move || Some((parts.next()?, parts.next()?)))
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    /// Names and values made printable; of a name given twice, the last.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Labels {
        let printable = vramscope_text::printable;
        let mut pairs: Vec<(String, String)> = iter
            .into_iter()
            .map(|(k, v)| (printable(k.as_ref()), printable(v.as_ref())))
            .collect();
        pairs.reverse();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs.dedup_by(|a, b| a.0 == b.0);
        let mut text = String::new();
        for (k, v) in &pairs {
            for part in [k, v] {
                text.push_str(part);
                text.push('\0');
            }
        }
        Labels(text.into())
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// One series' labels and one value (an instant query's answer).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    /// A label's value, "" when absent (as Prometheus treats it).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).unwrap_or("")
    }
}

/// One series over time (a range query's answer): (unix seconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub(crate) labels: Labels,
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
    result: SeriesList,
}

/// One series of a vector (`value`) or a matrix (`values`).
#[derive(Deserialize)]
struct RawSeries {
    metric: LabelMap,
    #[serde(default)]
    value: Option<Point>,
    #[serde(default)]
    values: Points,
}

/// A `[timestamp, "value"]` pair read as numbers: nothing when either is
/// not [`usable`]; an error when the value is not a number.
struct Point(Option<(f64, f64)>);

impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (t, v) = <(f64, String)>::deserialize(d)?;
        let v = number(&v).map_err(serde::de::Error::custom)?;
        Ok(Point(usable(t).zip(v)))
    }
}

/// A list of at most [`MAX_SERIES`] series: reading stops at the next one.
struct SeriesList(Vec<RawSeries>);

impl<'de> Deserialize<'de> for SeriesList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = SeriesList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a list of at most {MAX_SERIES} series")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    if v.len() == MAX_SERIES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_SERIES} series, the most the fleet view reads"
                        )));
                    }
                    v.push(x);
                }
                Ok(SeriesList(v))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// A series' points: at most [`MAX_POINTS`], those [`usable`] kept.
#[derive(Default)]
struct Points(Vec<(f64, f64)>);

impl<'de> Deserialize<'de> for Points {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Points;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a list of at most {MAX_POINTS} points")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let (mut kept, mut read) = (Vec::new(), 0);
                while let Some(Point(p)) = seq.next_element()? {
                    read += 1;
                    if read > MAX_POINTS {
                        return Err(serde::de::Error::custom(format!(
                            "more than {MAX_POINTS} points in a series, the most the fleet view reads"
                        )));
                    }
                    kept.extend(p);
                }
                Ok(Points(kept))
            }
        }
        d.deserialize_seq(Visit)
    }
}

/// A series' labels: at most [`MAX_LABELS`].
struct LabelMap(Labels);

impl<'de> Deserialize<'de> for LabelMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = LabelMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a map of at most {MAX_LABELS} labels")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    if pairs.len() == MAX_LABELS {
                        return Err(serde::de::Error::custom(format!(
                            "a series with more than {MAX_LABELS} labels"
                        )));
                    }
                    pairs.push(pair);
                }
                Ok(LabelMap(pairs.into_iter().collect()))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Prometheus writes values as strings ("NaN", "+Inf" included); one that
/// is not a number is an error, one that is not [`usable`] is nothing.
fn number(s: &str) -> Result<Option<f64>, String> {
    let v = match s {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        _ => s.parse::<f64>().map_err(|_| {
            format!(
                "a value is not a number: {:?}",
                vramscope_text::printable(s)
            )
        })?,
    };
    Ok(usable(v))
}

/// The API's `data` from an answer's bytes; `from` names the answer in
/// messages (`Prometheus at URL`).
fn data(body: &[u8], from: &str) -> Result<Data, String> {
    let answer: Answer = serde_json::from_slice(body)
        .map_err(|e| format!("{from} answered something that is not its API's JSON ({e})"))?;
    if answer.status != "success" {
        return Err(format!(
            "Prometheus refused a query: {}{}",
            answer
                .error_type
                .map(|t| format!("{}: ", vramscope_text::printable(&t)))
                .unwrap_or_default(),
            vramscope_text::printable(&answer.error.unwrap_or_default())
        ));
    }
    answer
        .data
        .ok_or_else(|| format!("{from}: a successful answer without data"))
}

/// An instant query's answer (a vector): one value per series; a series
/// whose value is not [`usable`] is left out.
pub fn vector(body: &[u8], from: &str) -> Result<Vec<Sample>, String> {
    let data = data(body, from)?;
    if data.result_type != "vector" {
        return Err(format!(
            "{from} answered a {} where a vector was asked for",
            vramscope_text::printable(&data.result_type)
        ));
    }
    let mut out = Vec::with_capacity(data.result.0.len());
    for r in data.result.0 {
        let Point(point) = r
            .value
            .ok_or_else(|| format!("{from}: a series of its vector has no value"))?;
        if let Some((_, value)) = point {
            out.push(Sample {
                labels: r.metric.0,
                value,
            });
        }
    }
    Ok(out)
}

/// A range query's answer (a matrix): every series with its [`usable`]
/// points.
pub fn matrix(body: &[u8], from: &str) -> Result<Vec<Series>, String> {
    let data = data(body, from)?;
    if data.result_type != "matrix" {
        return Err(format!(
            "{from} answered a {} where a matrix was asked for",
            vramscope_text::printable(&data.result_type)
        ));
    }
    Ok((data.result.0.into_iter())
        .map(|r| Series {
            labels: r.metric.0,
            points: r.values.0,
        })
        .collect())
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

    /// GET `path?params`, and the answer read by `read` on a blocking
    /// thread (a large answer does not hold up the runtime's worker).
    async fn get<T: Send + 'static>(
        &self,
        path: &str,
        params: &[(&str, String)],
        read: fn(&[u8], &str) -> Result<T, String>,
    ) -> Result<T, String> {
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
        let from = if status.is_success() {
            format!("Prometheus at {base}")
        } else {
            format!("Prometheus at {base} (HTTP {})", status.as_u16())
        };
        tokio::task::spawn_blocking(move || read(&body, &from))
            .await
            .map_err(|e| format!("Prometheus at {base}: reading its answer failed: {e}"))?
    }

    /// An instant query: one value per series (see [`vector`]).
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, String> {
        self.get("/api/v1/query", &[("query", promql.to_string())], vector)
            .await
    }

    /// A range query from `start` to `end` (unix seconds) every `step` s
    /// (see [`matrix`]).
    pub async fn query_range(
        &self,
        promql: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, String> {
        self.get(
            "/api/v1/query_range",
            &[
                ("query", promql.to_string()),
                ("start", format!("{start:.3}")),
                ("end", format!("{end:.3}")),
                ("step", format!("{step:.3}")),
            ],
            matrix,
        )
        .await
    }
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
    }

    /// Values past the boundary are finite and within ±2^64; the rest is
    /// dropped, and what is not a number is an error.
    #[test]
    fn unusable_values_are_dropped_at_the_boundary() {
        assert_eq!(number("1.5e9").unwrap(), Some(1.5e9));
        assert_eq!(number("-1e19").unwrap(), Some(-1e19));
        for v in ["+Inf", "-Inf", "NaN", "1e308", "-1e308", "inf", "1e20"] {
            assert_eq!(number(v).unwrap(), None, "{v}");
        }
        assert!(number("x").is_err());
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"a":"1"},"value":[1.5,"7"]},
            {"metric":{"a":"2"},"value":[1.5,"NaN"]},
            {"metric":{"a":"3"},"value":[1e308,"7"]},
            {"metric":{"a":"4\u0007"},"value":[1.5,"-1e308"]}]}}"#;
        let v = vector(body, "P").unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].label("a"), v[0].value), ("1", 7.0));
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"b":"\u0007"},"values":[[1,"1"],[2,"+Inf"],[3,"1e308"],[4,"2"],[-1e300,"3"]]}]}}"#;
        let m = matrix(body, "P").unwrap();
        assert_eq!(m[0].points, [(1.0, 1.0), (4.0, 2.0)]);
        assert_eq!(m[0].labels.get("b"), Some("\u{fffd}"));
        assert!(vector(body, "P")
            .unwrap_err()
            .contains("a matrix where a vector"));
        assert!(matrix(b"[1", "P")
            .unwrap_err()
            .starts_with("P answered something that is not"));
        let refused = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(
            vector(refused, "P").unwrap_err(),
            "Prometheus refused a query: bad_data: parse error"
        );
    }

    /// Labels in one string: by name, the last of a name given twice,
    /// made printable (a NUL too, so it cannot split a pair).
    #[test]
    fn labels_are_one_printable_string() {
        let l: Labels = [("b", "2"), ("a", "1\0x"), ("b", "3"), ("", "")]
            .into_iter()
            .collect();
        let pairs: Vec<(&str, &str)> = l.iter().collect();
        assert_eq!(pairs, [("", ""), ("a", "1\u{fffd}x"), ("b", "3")]);
        assert_eq!((l.get("b"), l.get("c"), l.len()), (Some("3"), None, 3));
        let none: Labels = Vec::<(String, String)>::new().into_iter().collect();
        assert!(none.is_empty() && none.iter().next().is_none());
        assert_eq!(
            format!("{l:?}"),
            "{\"\": \"\", \"a\": \"1\u{fffd}x\", \"b\": \"3\"}"
        );
    }

    /// More series, points or labels than the bounds: one line, whatever
    /// the rest of the answer holds.
    #[test]
    fn answers_past_the_bounds_are_refused() {
        let series = |n: usize| {
            let one = r#"{"metric":{},"value":[1,"1"]}"#;
            format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
                vec![one; n].join(",")
            )
        };
        assert_eq!(
            vector(series(MAX_SERIES).as_bytes(), "P").unwrap().len(),
            MAX_SERIES
        );
        let e = vector(series(MAX_SERIES + 1).as_bytes(), "P").unwrap_err();
        assert!(e.contains("more than 250000 series"), "{e}");
        let points = vec![r#"[1,"1"]"#; MAX_POINTS + 1].join(",");
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{points}]}}]}}}}"#
        );
        let e = matrix(body.as_bytes(), "P").unwrap_err();
        assert!(e.contains("more than 11000 points in a series"), "{e}");
        let labels: Vec<String> = (0..=MAX_LABELS).map(|i| format!(r#""l{i}":"v""#)).collect();
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{{}}},"value":[1,"1"]}}]}}}}"#,
            labels.join(",")
        );
        let e = vector(body.as_bytes(), "P").unwrap_err();
        assert!(e.contains("more than 64 labels"), "{e}");
    }
}
