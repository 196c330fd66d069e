//! Line charts as SVG, drawn with plotters (SVG backend only: no font or
//! system libraries; the viewer lays out the text).

use std::ops::Range;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Ticks at powers of ten.
    Log10,
    /// Ticks at powers of two (client counts).
    Log2,
}

pub struct Series {
    pub name: String,
    pub color: RGBColor,
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

const SIZE: (u32, u32) = (800, 440);
/// The legend sits right of the plot, never over a line.
const LEGEND_WIDTH: u32 = 230;

pub const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

pub fn render(chart: &Chart) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let points = || chart.series.iter().flat_map(|s| s.points.iter());
        let base = match chart.x_scale {
            Scale::Log10 => 10.0,
            Scale::Log2 => 2.0,
        };
        let x = log_bounds(base, points().map(|p| p.0));
        draw(&plot, chart, base, x, y_range(points().map(|p| p.1)))?;
        draw_legend(&legend, &chart.series)?;
        root.present().map_err(fail)?;
    }
    Ok(svg)
}

/// Draws the axes and series on `area`, x on a log scale of `base`; x values
/// below the axis (zero delays) are drawn at its floor.
fn draw(area: &Area, chart: &Chart, base: f64, x: Range<f64>, y: Range<f64>) -> Result<(), String> {
    let (floor, powers) = (x.start, (x.end / x.start).log(base).round() as usize);
    let mut plot = ChartBuilder::on(area)
        .caption(&chart.title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x.log_scale().base(base), y)
        .map_err(fail)?;
    plot.configure_mesh()
        // One label per power: with more, plotters adds ticks in between.
        .x_labels(powers + 1)
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_label_formatter(&|v| label(*v))
        .y_label_formatter(&|v| label(*v))
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(fail)?;
    if chart.series.iter().all(|s| s.points.is_empty()) {
        let centre = Pos::new(HPos::Center, VPos::Center);
        let (w, h) = plot.plotting_area().dim_in_pixel();
        let text = ("sans-serif", 12)
            .into_font()
            .into_text_style(area)
            .pos(centre);
        plot.plotting_area()
            .strip_coord_spec()
            .draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), text))
            .map_err(fail)?;
    }
    for s in &chart.series {
        let points: Vec<(f64, f64)> = s.points.iter().map(|&(a, b)| (a.max(floor), b)).collect();
        let style = s.color.stroke_width(2);
        if s.dashed {
            plot.draw_series(DashedLineSeries::new(points.iter().copied(), 6, 4, style))
                .map_err(fail)?;
        } else {
            plot.draw_series(LineSeries::new(points.iter().copied(), style))
                .map_err(fail)?;
        }
        if s.markers {
            let dots = points.iter().map(|&p| Circle::new(p, 3, s.color.filled()));
            plot.draw_series(dots).map_err(fail)?;
        }
    }
    Ok(())
}

fn draw_legend(area: &Area, series: &[Series]) -> Result<(), String> {
    let left = Pos::new(HPos::Left, VPos::Center);
    for (i, s) in series.iter().enumerate() {
        let y = 50 + 20 * i as i32;
        let style = s.color.stroke_width(2);
        let line = vec![(4, y), (28, y)];
        if s.dashed {
            area.draw(&DashedPathElement::new(line, 6, 4, style))
        } else {
            area.draw(&PathElement::new(line, style))
        }
        .map_err(fail)?;
        let text = ("sans-serif", 12)
            .into_font()
            .into_text_style(area)
            .pos(left);
        area.draw(&Text::new(s.name.clone(), (34, y), text))
            .map_err(fail)?;
    }
    Ok(())
}

/// From 0 (or the lowest value, if negative) to a little above the highest.
fn y_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((0.0, 0.0), |(lo, hi): (f64, f64), v| (lo.min(v), hi.max(v)));
    if hi > lo {
        lo..hi * 1.05
    } else {
        lo..lo + 1.0
    }
}

/// Whole powers of `base` around the positive values (1‥`base` for none).
fn log_bounds(base: f64, values: impl Iterator<Item = f64> + Clone) -> Range<f64> {
    let positive = values.filter(|v| *v > 0.0);
    let min = positive.clone().fold(f64::INFINITY, f64::min);
    let max = positive.fold(f64::NEG_INFINITY, f64::max);
    if !min.is_finite() {
        return 1.0..base;
    }
    let lo = min.log(base).floor() as i32;
    let hi = (max.log(base).ceil() as i32).max(lo + 1);
    base.powi(lo)..base.powi(hi)
}

fn label(v: f64) -> String {
    // Tick values are computed in floats: round away the noise (0.6000000000000001).
    let v = (v * 1e6).round() / 1e6;
    format!("{v}")
}

fn fail(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
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

    fn chart(x_scale: Scale, series: Vec<Series>) -> Chart {
        Chart {
            title: "a < b".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale,
            series,
        }
    }

    fn series(points: Vec<(f64, f64)>, dashed: bool) -> Series {
        Series {
            name: "s & t".into(),
            color: COLORS[0],
            dashed,
            markers: true,
            points,
        }
    }

    #[test]
    fn renders_well_formed_svg() {
        for scale in [Scale::Log10, Scale::Log2] {
            for dashed in [false, true] {
                let points = cdf(&[0.0, 0.5, 3.0, 120.0]);
                let svg = render(&chart(scale, vec![series(points, dashed)])).unwrap();
                assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
                assert!(
                    svg.contains("a &lt; b") && svg.contains("s &amp; t"),
                    "{svg}"
                );
                assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
            }
        }
        let empty = render(&chart(Scale::Log2, vec![])).unwrap();
        assert!(empty.contains("no data"));
    }

    #[test]
    fn log_axes_span_whole_powers_and_zero_sits_at_the_floor() {
        assert_eq!(
            log_bounds(10.0, [0.0, 0.5, 3.0, 120.0].into_iter()),
            0.1..1000.0
        );
        assert_eq!(log_bounds(2.0, [1.0, 4.0, 16.0].into_iter()), 1.0..16.0);
        assert_eq!(log_bounds(2.0, [0.0].into_iter()), 1.0..2.0);
        assert_eq!(y_range([].into_iter()), 0.0..1.0);
    }

    #[test]
    fn labels_hide_float_noise() {
        assert_eq!(label(0.2 * 3.0), "0.6");
        assert_eq!(label(1000.0), "1000");
        assert_eq!(label(0.1), "0.1");
    }
}
