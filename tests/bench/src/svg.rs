//! Line charts as hand-written SVG: no font or system libraries needed.

use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Ticks at powers of ten.
    Log10,
    /// Ticks at powers of two (client counts).
    Log2,
}

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub dashed: bool,
    /// Dots on every point: for a few measured points, not a CDF.
    pub markers: bool,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub series: Vec<Series>,
}

const W: f64 = 800.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 250.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

pub const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// An axis: maps data to [0, 1] and lists its ticks.
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Axis {
    fn new(scale: Scale, values: impl Iterator<Item = f64> + Clone) -> Self {
        let (mut min, mut max) = values
            .clone()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        if !min.is_finite() {
            (min, max) = (0.0, 1.0);
        }
        match scale {
            Scale::Linear => {
                let step = nice_step(max.max(0.0) / 5.0);
                let hi = ((max / step).ceil() * step).max(step);
                let lo = if min >= 0.0 {
                    0.0
                } else {
                    (min / step).floor() * step
                };
                let ticks = (0..)
                    .map(|i| lo + step * f64::from(i))
                    .take_while(|t| *t <= hi + step * 1e-9)
                    .collect();
                Axis {
                    scale,
                    lo,
                    hi,
                    ticks,
                }
            }
            Scale::Log10 | Scale::Log2 => {
                let base: f64 = if scale == Scale::Log10 { 10.0 } else { 2.0 };
                // Log axes need positive values; zero delays sit at the floor.
                let min = values.filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
                let min = if min.is_finite() { min } else { 1.0 };
                let lo_exp = min.log(base).floor() as i32;
                let hi_exp = (max.max(min).log(base).ceil() as i32).max(lo_exp + 1);
                let ticks = (lo_exp..=hi_exp).map(|e| base.powi(e)).collect();
                Axis {
                    scale,
                    lo: base.powi(lo_exp),
                    hi: base.powi(hi_exp),
                    ticks,
                }
            }
        }
    }

    fn unit(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.lo) / (self.hi - self.lo),
            Scale::Log10 | Scale::Log2 => {
                let v = v.max(self.lo);
                (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
            }
        }
    }
}

/// 1, 2 or 5 × 10^k at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn label(v: f64) -> String {
    // Ticks are sums of steps: round away the float noise (0.6000000000000001).
    let v = (v * 1e6).round() / 1e6;
    format!("{v}")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render(chart: &Chart) -> String {
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let x = Axis::new(chart.x_scale, points().map(|p| p.0));
    let y = Axis::new(Scale::Linear, points().map(|p| p.1));
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |v: f64| LEFT + x.unit(v) * pw;
    let py = |v: f64| TOP + ph - y.unit(v) * ph;

    let mut svg = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
"#,
        LEFT + pw / 2.0,
        escape(&chart.title)
    );
    for t in &x.ticks {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#ddd"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>"##,
            px(*t),
            TOP,
            TOP + ph,
            TOP + ph + 16.0,
            label(*t)
        );
    }
    for t in &y.ticks {
        let _ = writeln!(
            svg,
            r##"<line x1="{0}" y1="{1:.1}" x2="{2}" y2="{1:.1}" stroke="#ddd"/><text x="{3}" y="{4:.1}" text-anchor="end">{5}</text>"##,
            LEFT,
            py(*t),
            LEFT + pw,
            LEFT - 6.0,
            py(*t) + 4.0,
            label(*t)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + pw / 2.0,
        H - 14.0,
        escape(&chart.x_label),
        TOP + ph / 2.0,
        escape(&chart.y_label)
    );
    if chart.series.iter().all(|s| s.points.is_empty()) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">no data</text>"#,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    for (i, s) in chart.series.iter().enumerate() {
        let dash = if s.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        if !s.points.is_empty() {
            let path: Vec<String> = s
                .points
                .iter()
                .map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                path.join(" "),
                s.color
            );
        }
        if s.markers {
            for (a, b) in &s.points {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/>"#,
                    px(*a),
                    py(*b),
                    s.color
                );
            }
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            s.color,
            lx + 30.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The empirical CDF of samples, as (value, fraction ≤ value) steps.
pub fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, v)| (*v, (i + 1) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_well_formed_svg() {
        let chart = Chart {
            title: "a < b".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: Scale::Log10,
            series: vec![Series {
                name: "s".into(),
                color: COLORS[0],
                dashed: true,
                markers: true,
                points: cdf(&[0.0, 0.5, 3.0, 120.0]),
            }],
        };
        let svg = render(&chart);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt; b") && !svg.contains("NaN"));
        let empty = Chart {
            series: vec![],
            x_scale: Scale::Linear,
            ..chart
        };
        assert!(render(&empty).contains("no data"));
    }

    #[test]
    fn labels_hide_float_noise() {
        assert_eq!(label(0.2 * 3.0), "0.6");
        assert_eq!(label(1000.0), "1000");
        assert_eq!(label(0.1), "0.1");
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(42.0), 50.0);
    }
}
