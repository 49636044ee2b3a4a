//! PNG charts drawn with plotters' bitmap backend and a bundled font
//! (DejaVu Sans, `harness/assets/`), so no system fontconfig is needed.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// Registers the bundled font under "sans-serif" once per process.
pub fn init_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok()
            && plotters::style::register_font(FAMILY, FontStyle::Bold, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the bundled DejaVu Sans font could not be registered"
        ))
    }
}

/// One point: x, the value, and its interval (lo, hi) drawn as an error bar.
#[derive(Clone, Debug, PartialEq)]
pub struct Pt {
    pub x: f64,
    pub y: f64,
    pub lo: f64,
    pub hi: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<Pt>,
    /// A vendor reference: drawn dashed in dark grey/black with cross
    /// markers, apart from the variants' coloured solid lines.
    pub reference: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
    /// A horizontal reference line (e.g. 100 % of roof), if any.
    pub hline: Option<f64>,
}

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// Colours of reference series (dark, unlike the variants' palette).
fn ref_color(i: usize) -> RGBColor {
    const C: [RGBColor; 3] = [
        RGBColor(0, 0, 0),
        RGBColor(105, 105, 105),
        RGBColor(90, 40, 20),
    ];
    C[i % C.len()]
}

fn pad_range(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (1.0, 10.0);
    }
    if log {
        let lo = lo.max(1e-9);
        let hi = hi.max(lo * 1.0001);
        (lo / 1.3, hi * 1.3)
    } else {
        let span = (hi - lo).max(hi.abs() * 0.1).max(1e-9);
        (
            (lo - 0.08 * span).min(0.0f64.max(lo - span)),
            hi + 0.08 * span,
        )
    }
}

fn draw_err<E: std::fmt::Debug>(r: std::result::Result<(), E>) -> Result<()> {
    r.map_err(|e| anyhow!("plot: {e:?}"))
}

/// Line charts, one panel per entry laid out on a grid; x is log2-scaled
/// (token counts), y log or linear; each point has a p10-p90 style bar.
pub fn line_panels(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    draw_line_panels(path, title, panels, true)
}

/// `line_panels` with a linear x axis (rep numbers, sequence positions).
pub fn line_panels_linear(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    draw_line_panels(path, title, panels, false)
}

fn draw_line_panels(path: &Path, title: &str, panels: &[Panel], log_x: bool) -> Result<()> {
    init_font()?;
    if panels.is_empty() {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let cols = if panels.len() == 1 { 1 } else { 2 };
    let rows = panels.len().div_ceil(cols);
    let (w, h) = (900 * cols as u32, 80 + 520 * rows as u32);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    draw_err(root.fill(&WHITE))?;
    let root = root
        .titled(title, (FAMILY, 26).into_font())
        .map_err(|e| anyhow!("plot: {e:?}"))?;
    let areas = root.split_evenly((rows, cols));
    for (p, area) in panels.iter().zip(areas.iter()) {
        let pts = p.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for q in pts {
            x0 = x0.min(q.x);
            x1 = x1.max(q.x);
            y0 = y0.min(q.lo.min(q.y));
            y1 = y1.max(q.hi.max(q.y));
        }
        if let Some(hl) = p.hline {
            y0 = y0.min(hl);
            y1 = y1.max(hl);
        }
        let (x0, x1) = if log_x {
            pad_range(x0, x1, true)
        } else {
            let span = (x1 - x0).max(1.0);
            (x0 - 0.03 * span, x1 + 0.03 * span)
        };
        let (y0, y1) = pad_range(y0, y1, p.log_y);
        let mut cb = ChartBuilder::on(area);
        cb.caption(&p.title, (FAMILY, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        macro_rules! body {
            ($chart:expr) => {{
                let mut chart = $chart;
                draw_err(
                    chart
                        .configure_mesh()
                        .x_desc(p.x_label.as_str())
                        .y_desc(p.y_label.as_str())
                        .label_style((FAMILY, 13))
                        .draw(),
                )?;
                if let Some(hl) = p.hline {
                    draw_err(
                        chart
                            .draw_series(LineSeries::new(vec![(x0, hl), (x1, hl)], BLACK.mix(0.5)))
                            .map(|_| ()),
                    )?;
                }
                let (mut nv, mut nr) = (0usize, 0usize);
                for s in &p.series {
                    let c = if s.reference {
                        nr += 1;
                        ref_color(nr - 1)
                    } else {
                        nv += 1;
                        color(nv - 1)
                    };
                    let line: Vec<(f64, f64)> = s.points.iter().map(|q| (q.x, q.y)).collect();
                    if s.reference {
                        draw_err(
                            chart
                                .draw_series(DashedLineSeries::new(
                                    line.clone(),
                                    8,
                                    5,
                                    c.stroke_width(2),
                                ))
                                .map(|a| {
                                    a.label(s.label.clone()).legend(move |(x, y)| {
                                        Cross::new((x + 9, y), 5, c.stroke_width(2))
                                    });
                                }),
                        )?;
                        draw_err(
                            chart
                                .draw_series(
                                    line.iter()
                                        .map(|&(x, y)| Cross::new((x, y), 6, c.stroke_width(2))),
                                )
                                .map(|_| ()),
                        )?;
                    } else {
                        draw_err(
                            chart
                                .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
                                .map(|a| {
                                    a.label(s.label.clone()).legend(move |(x, y)| {
                                        PathElement::new(
                                            vec![(x, y), (x + 18, y)],
                                            c.stroke_width(3),
                                        )
                                    });
                                }),
                        )?;
                        draw_err(
                            chart
                                .draw_series(
                                    line.iter()
                                        .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
                                )
                                .map(|_| ()),
                        )?;
                    }
                    draw_err(
                        chart
                            .draw_series(s.points.iter().map(|q| {
                                PathElement::new(vec![(q.x, q.lo), (q.x, q.hi)], c.stroke_width(2))
                            }))
                            .map(|_| ()),
                    )?;
                }
                draw_err(
                    chart
                        .configure_series_labels()
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK.mix(0.3))
                        .label_font((FAMILY, 12))
                        .position(SeriesLabelPosition::UpperLeft)
                        .draw(),
                )?;
            }};
        }
        match (log_x, p.log_y) {
            (true, true) => {
                let chart = cb
                    .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                    .map_err(|e| anyhow!("plot: {e:?}"))?;
                body!(chart);
            }
            (true, false) => {
                let chart = cb
                    .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                    .map_err(|e| anyhow!("plot: {e:?}"))?;
                body!(chart);
            }
            (false, true) => {
                let chart = cb
                    .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
                    .map_err(|e| anyhow!("plot: {e:?}"))?;
                body!(chart);
            }
            (false, false) => {
                let chart = cb
                    .build_cartesian_2d(x0..x1, y0..y1)
                    .map_err(|e| anyhow!("plot: {e:?}"))?;
                body!(chart);
            }
        }
    }
    draw_err(root.present())?;
    Ok(())
}

/// A two-axis sweep: `cells[yi][xi]` (None = rejected or not measured).
#[derive(Clone, Debug, PartialEq)]
pub struct Heat {
    pub title: String,
    pub x_name: String,
    pub y_name: String,
    pub x_vals: Vec<String>,
    pub y_vals: Vec<String>,
    pub cells: Vec<Vec<Option<f64>>>,
    /// Unit of the cell values, shown in each cell ("us").
    pub unit: String,
}

/// Heat map: greener is faster (smaller values), grey cells are missing.
pub fn heatmap(path: &Path, h: &Heat) -> Result<()> {
    init_font()?;
    let nx = h.x_vals.len();
    let ny = h.y_vals.len();
    if nx == 0 || ny == 0 {
        return Err(anyhow!("{}: empty heat map", path.display()));
    }
    let vals: Vec<f64> = h.cells.iter().flatten().flatten().copied().collect();
    let best = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let worst = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (w, hgt) = (200 + 120 * nx as u32, 160 + 70 * ny as u32);
    let root = BitMapBackend::new(path, (w.max(900), hgt.max(360))).into_drawing_area();
    draw_err(root.fill(&WHITE))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&h.title, (FAMILY, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d((0..nx - 1).into_segmented(), (0..ny - 1).into_segmented())
        .map_err(|e| anyhow!("plot: {e:?}"))?;
    let xv = h.x_vals.clone();
    let yv = h.y_vals.clone();
    draw_err(
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(h.x_name.as_str())
            .y_desc(h.y_name.as_str())
            .x_labels(nx + 1)
            .y_labels(ny + 1)
            .x_label_formatter(&|v| seg_label(v, &xv))
            .y_label_formatter(&|v| seg_label(v, &yv))
            .label_style((FAMILY, 13))
            .draw(),
    )?;
    for (yi, row) in h.cells.iter().enumerate() {
        for (xi, c) in row.iter().enumerate() {
            let fill = match c {
                Some(v) => {
                    let t = if worst > best {
                        (v - best) / (worst - best)
                    } else {
                        0.0
                    };
                    RGBColor((40.0 + 200.0 * t) as u8, (190.0 - 120.0 * t) as u8, 80)
                }
                None => RGBColor(200, 200, 200),
            };
            draw_err(
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [
                            (SegmentValue::Exact(xi), SegmentValue::Exact(yi)),
                            (SegmentValue::Exact(xi + 1), SegmentValue::Exact(yi + 1)),
                        ],
                        fill.filled(),
                    )))
                    .map(|_| ()),
            )?;
            let text = match c {
                Some(v) => format!("{v:.1} {}", h.unit),
                None => "-".to_string(),
            };
            draw_err(
                chart
                    .draw_series(std::iter::once(Text::new(
                        text,
                        (SegmentValue::CenterOf(xi), SegmentValue::CenterOf(yi)),
                        (FAMILY, 13).into_font().color(&BLACK),
                    )))
                    .map(|_| ()),
            )?;
        }
    }
    draw_err(root.present())?;
    Ok(())
}

fn seg_label(v: &SegmentValue<usize>, names: &[String]) -> String {
    match v {
        SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// How a bar is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarClass {
    /// A regression or a slow-down (red).
    Bad,
    /// An improvement or a speed-up (green).
    Good,
    /// Neither (blue).
    Neutral,
}

/// One horizontal bar: a value, its interval (a whisker) and a band around
/// zero it is judged against (a grey strip behind the bar).
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub ci: Option<(f64, f64)>,
    pub band: Option<f64>,
    pub class: BarClass,
}

/// A horizontal bar chart, one row per bar (top to bottom in order), with
/// vertical reference lines at `vlines` (0 is always drawn).
pub fn bars(path: &Path, title: &str, x_label: &str, items: &[Bar], vlines: &[f64]) -> Result<()> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    init_font()?;
    if items.is_empty() {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let n = items.len();
    let (mut x0, mut x1) = (0.0f64, 0.0f64);
    for b in items {
        let mut vals = vec![b.value];
        if let Some((lo, hi)) = b.ci {
            vals.extend([lo, hi]);
        }
        if let Some(w) = b.band {
            vals.extend([-w, w]);
        }
        for v in vals.into_iter().filter(|v| v.is_finite()) {
            x0 = x0.min(v);
            x1 = x1.max(v);
        }
    }
    for v in vlines {
        x0 = x0.min(*v);
        x1 = x1.max(*v);
    }
    let span = (x1 - x0).max(1e-9);
    let (x0, x1) = (x0 - 0.08 * span, x1 + 0.08 * span);
    let label_w = 430u32;
    let h = (120 + 30 * n as u32).max(260);
    let root = BitMapBackend::new(path, (1300, h)).into_drawing_area();
    draw_err(root.fill(&WHITE))?;
    let (left, right) = root.split_horizontally(label_w);
    let mut chart = ChartBuilder::on(&right)
        .caption(title, (FAMILY, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(0)
        .build_cartesian_2d(x0..x1, 0.0..n as f64)
        .map_err(|e| anyhow!("plot: {e:?}"))?;
    draw_err(
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc(x_label)
            .label_style((FAMILY, 13))
            .draw(),
    )?;
    // Row i (from the top) spans [n-1-i, n-i].
    let row = |i: usize| (n - 1 - i) as f64;
    let style = (FAMILY, 13)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for (i, b) in items.iter().enumerate() {
        let y = row(i);
        if let Some(w) = b.band.filter(|w| w.is_finite() && *w > 0.0) {
            draw_err(
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(-w, y + 0.05), (w, y + 0.95)],
                        RGBColor(225, 225, 225).filled(),
                    )))
                    .map(|_| ()),
            )?;
        }
        let c = match b.class {
            BarClass::Bad => RGBColor(214, 39, 40),
            BarClass::Good => RGBColor(44, 160, 44),
            BarClass::Neutral => RGBColor(31, 119, 180),
        };
        if b.value.is_finite() {
            draw_err(
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y + 0.2), (b.value, y + 0.8)],
                        c.mix(0.85).filled(),
                    )))
                    .map(|_| ()),
            )?;
        }
        if let Some((lo, hi)) = b.ci.filter(|(l, h)| l.is_finite() && h.is_finite()) {
            draw_err(
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(lo, y + 0.5), (hi, y + 0.5)],
                        BLACK.stroke_width(2),
                    )))
                    .map(|_| ()),
            )?;
            for x in [lo, hi] {
                draw_err(
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(x, y + 0.35), (x, y + 0.65)],
                            BLACK.stroke_width(2),
                        )))
                        .map(|_| ()),
                )?;
            }
        }
        // The label, right-aligned in the left strip at the row's centre.
        let (_, py) = chart.backend_coord(&(x0, y + 0.5));
        draw_err(
            left.draw_text(&b.label, &style, (label_w as i32 - 8, py))
                .map(|_| ()),
        )?;
    }
    for v in std::iter::once(&0.0).chain(vlines.iter()) {
        draw_err(
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(*v, 0.0), (*v, n as f64)],
                    BLACK.mix(if *v == 0.0 { 0.8 } else { 0.4 }),
                )))
                .map(|_| ()),
        )?;
    }
    draw_err(root.present())?;
    Ok(())
}
