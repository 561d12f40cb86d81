//! One rendering of `/metrics`: the families collected, then encoded by the Prometheus
//! client library.

use super::*;

pub(super) type Labels = Vec<(String, String)>;
pub(super) type Row = (Labels, Value);

#[derive(Debug)]
pub(super) enum Value {
    Count(u64),
    Seconds(f64),
    Gauge(f64),
    Histogram(HistogramSnapshot),
}

#[derive(Debug)]
pub(super) struct Family {
    pub(super) name: String,
    pub(super) help: String,
    pub(super) kind: MetricType,
    pub(super) rows: Vec<Row>,
}

/// Every series as read at one scrape, handed to the client library to encode.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    pub(super) families: Vec<Family>,
}

impl Snapshot {
    /// A family of series; counters are named without `_total`, which the encoder adds.
    pub(super) fn family(&mut self, name: &str, help: &str, kind: MetricType, rows: Vec<Row>) {
        self.families.push(Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            rows,
        });
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.families {
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, family.kind)?;
            for (labels, value) in &family.rows {
                let mut row = metric.encode_family(labels)?;
                match value {
                    Value::Count(n) => row.encode_counter::<NoLabelSet, _, u64>(n, None)?,
                    Value::Seconds(s) => row.encode_counter::<NoLabelSet, _, f64>(s, None)?,
                    Value::Gauge(v) => row.encode_gauge(v)?,
                    Value::Histogram(h) => row.encode_histogram::<NoLabelSet>(
                        h.sum_seconds,
                        h.count,
                        &h.buckets,
                        None,
                    )?,
                }
            }
        }
        Ok(())
    }
}
