//! What the daemon's and the operator's metrics share past their names: a
//! registry as Prometheus' text exposition ([`encode`]), and a count as a
//! gauge's value ([`gauge_value`]).

use prometheus_client::registry::Registry;

/// The text exposition of `registry` (`# HELP`, `# TYPE`, one line a sample,
/// `# EOF`); what could not be encoded is logged and left out.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// A count as a gauge holds it: `i64::MAX` for a count past it.
pub fn gauge_value(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        name: String,
    }

    #[test]
    fn the_exposition_is_prometheus_text_byte_for_byte() {
        let mut registry = Registry::with_prefix("podnet_test");
        let gauge = Gauge::<i64>::default();
        let counter = Family::<Labels, Counter>::default();
        registry.register("things", "Things, by nothing", gauge.clone());
        registry.register("seen", "Seen, by name", counter.clone());
        gauge.set(gauge_value(3usize));
        counter
            .get_or_create(&Labels {
                name: "a \"quoted\\\" \n name".into(),
            })
            .inc();
        assert_eq!(
            encode(&registry),
            "# HELP podnet_test_things Things, by nothing.\n\
             # TYPE podnet_test_things gauge\n\
             podnet_test_things 3\n\
             # HELP podnet_test_seen Seen, by name.\n\
             # TYPE podnet_test_seen counter\n\
             podnet_test_seen_total{name=\"a \\\"quoted\\\\\\\" \\n name\"} 1\n\
             # EOF\n"
        );
    }

    #[test]
    fn a_count_past_a_gauge_saturates() {
        assert_eq!(gauge_value(0usize), 0);
        assert_eq!(gauge_value(7u64), 7);
        assert_eq!(gauge_value(u64::MAX), i64::MAX);
        assert_eq!(gauge_value(u128::MAX), i64::MAX);
        assert_eq!(gauge_value(usize::MAX), i64::MAX);
    }
}
