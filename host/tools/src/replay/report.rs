//! What a replay reports: a CSV row and a table line per policy, and an SVG chart.

use super::*;

/// One CSV row per policy (the `csv` crate quotes what needs it).
pub fn csv(reports: &[PolicyReport]) -> String {
    #[derive(serde::Serialize)]
    struct Row<'a> {
        policy: &'a str,
        requests: usize,
        prefix_hit_rate: String,
        load_imbalance: String,
        ttft_p50_ms: String,
        ttft_p99_ms: String,
        selections_per_s: String,
        fallbacks: u64,
        adapter_hit_rate: String,
        refused: u64,
    }
    let mut writer = csv::Writer::from_writer(Vec::new());
    for r in reports {
        // Writing to memory cannot fail.
        let _ = writer.serialize(Row {
            policy: &r.policy,
            requests: r.requests,
            prefix_hit_rate: format!("{:.4}", r.hit_rate),
            load_imbalance: format!("{:.3}", r.imbalance),
            ttft_p50_ms: format!("{:.1}", r.ttft_p50_ms),
            ttft_p99_ms: format!("{:.1}", r.ttft_p99_ms),
            selections_per_s: format!("{:.0}", r.selections_per_s),
            fallbacks: r.fallbacks,
            adapter_hit_rate: r
                .adapter_hit_rate
                .map_or(String::new(), |a| format!("{a:.4}")),
            refused: r.refused,
        });
        for t in &r.tenants {
            let _ = writer.serialize(Row {
                policy: &format!("{} [{}]", r.policy, t.tenant),
                requests: t.served as usize,
                prefix_hit_rate: String::new(),
                load_imbalance: String::new(),
                ttft_p50_ms: format!("{:.1}", t.ttft_p50_ms),
                ttft_p99_ms: format!("{:.1}", t.ttft_p99_ms),
                selections_per_s: String::new(),
                fallbacks: 0,
                adapter_hit_rate: String::new(),
                refused: t.refused,
            });
        }
    }
    String::from_utf8(writer.into_inner().unwrap_or_default()).unwrap_or_default()
}

pub fn table(reports: &[PolicyReport]) -> String {
    let mut out = format!(
        "{:<24} {:>9} {:>10} {:>10} {:>13} {:>13} {:>14}\n",
        "policy", "requests", "hit rate", "imbalance", "TTFT p50 ms", "TTFT p99 ms", "selections/s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<24} {:>9} {:>9.1}% {:>10.2} {:>13.1} {:>13.1} {:>14.0}{}",
            r.policy,
            r.requests,
            r.hit_rate * 100.0,
            r.imbalance,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.selections_per_s,
            match (r.fallbacks, r.adapter_hit_rate) {
                (0, None) => String::new(),
                (0, Some(a)) => format!("  adapter hits {:.1}%", a * 100.0),
                (n, None) => format!("  ({n} fallbacks)"),
                (n, Some(a)) => format!("  ({n} fallbacks) adapter hits {:.1}%", a * 100.0),
            }
        );
        if r.refused > 0 && r.tenants.is_empty() {
            let _ = writeln!(
                out,
                "{:<24} refused by the admission queue: {}",
                "", r.refused
            );
        }
        for t in &r.tenants {
            let _ = writeln!(
                out,
                "{:<24} {:>9} {:>10} {:>10} {:>13.1} {:>13.1}   refused {}",
                format!("  [{}]", t.tenant),
                t.served,
                "",
                "",
                t.ttft_p50_ms,
                t.ttft_p99_ms,
                t.refused
            );
        }
    }
    out
}

/// Four bar charts side by side (hit rate, load imbalance, TTFT p50 and p99), one bar
/// per policy, with axes, units and a legend, drawn by `plotters` as SVG.
pub fn svg(reports: &[PolicyReport], title: &str) -> String {
    use plotters::prelude::*;
    type Panel = (&'static str, &'static str, fn(&PolicyReport) -> f64);
    let panels: [Panel; 4] = [
        ("prefix-cache hit rate", "%", |r| r.hit_rate * 100.0),
        ("load imbalance", "max / mean active tokens", |r| {
            r.imbalance
        }),
        ("TTFT p50", "ms", |r| r.ttft_p50_ms),
        ("TTFT p99", "ms", |r| r.ttft_p99_ms),
    ];
    let mut out = String::new();
    let legend_h = 24 * reports.len() as u32 + 16;
    {
        let root = SVGBackend::with_string(&mut out, (1120, 420 + legend_h)).into_drawing_area();
        let draw = || -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let (chart_area, legend) = root.split_vertically(420);
            let chart_area = chart_area.titled(title, ("sans-serif", 16))?;
            for (area, (name, unit, value)) in chart_area
                .split_evenly((1, panels.len()))
                .iter()
                .zip(panels)
            {
                let max = reports.iter().map(value).fold(0.0, f64::max).max(1e-9) * 1.15;
                let mut chart = ChartBuilder::on(area)
                    .caption(name, ("sans-serif", 14))
                    .margin(8)
                    .x_label_area_size(36)
                    .y_label_area_size(52)
                    .build_cartesian_2d((0..reports.len()).into_segmented(), 0.0..max)?;
                chart
                    .configure_mesh()
                    .disable_x_mesh()
                    .x_desc("policy")
                    .y_desc(unit)
                    .x_label_formatter(&|x| match x {
                        SegmentValue::CenterOf(i) if *i < reports.len() => format!("{}", i + 1),
                        _ => String::new(),
                    })
                    .draw()?;
                for (i, report) in reports.iter().enumerate() {
                    let color = Palette99::pick(i).mix(0.9).filled();
                    let bar = Rectangle::new(
                        [
                            (SegmentValue::Exact(i), 0.0),
                            (SegmentValue::Exact(i + 1), value(report)),
                        ],
                        color,
                    );
                    chart.draw_series(std::iter::once(bar))?;
                }
            }
            for (i, report) in reports.iter().enumerate() {
                let y = 12 + 24 * i as i32;
                legend.draw(&Rectangle::new(
                    [(20, y), (34, y + 14)],
                    Palette99::pick(i).filled(),
                ))?;
                legend.draw(&Text::new(
                    format!("{}: {}", i + 1, report.policy),
                    (42, y + 1),
                    ("sans-serif", 13),
                ))?;
            }
            root.present()?;
            Ok(())
        };
        if let Err(e) = draw() {
            tracing::warn!(error = %e, "drawing the replay chart failed");
        }
    }
    out
}
