//! A study's curves as one SVG: error vs epoch per point, test error solid and training error dashed, like
//! Goyal et al.'s Figure 2. Plain text, no dependencies: the CLI writes it to a file and the API serves it.

use std::fmt::Write;

/// One point's curves, per finished epoch (epoch 1 first). Each ends in a dot (filled: test), so a point
/// stopped after one epoch (a search's) is still seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub label: String,
    pub train_error: Vec<f64>,
    pub test_error: Vec<f64>,
}

const WIDTH: f64 = 1040.0;
const HEIGHT: f64 = 540.0;
/// The plot area: left, top, right and bottom edges (the legend is right of it).
const AREA: (f64, f64, f64, f64) = (60.0, 40.0, 640.0, 490.0);
/// Distinct colours for up to a dozen points (then they repeat).
const PALETTE: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#aec7e8",
];

/// The SVG document.
pub fn svg(title: &str, curves: &[Curve]) -> String {
    let (left, top, right, bottom) = AREA;
    let epochs = curves.iter().map(|c| c.train_error.len().max(c.test_error.len())).max().unwrap_or(0).max(1);
    let highest = curves.iter().flat_map(|c| c.train_error.iter().chain(&c.test_error)).copied().fold(0.0, f64::max);
    // the y range: 0 to the highest error rounded up to a tenth, at least 0.1
    let y_max = ((highest * 10.0).ceil() / 10.0).clamp(0.1, 1.0);
    let x = |epoch: usize| left + (right - left) * (epoch as f64 - 1.0) / (epochs.max(2) as f64 - 1.0);
    let y = |error: f64| bottom - (bottom - top) * (error.clamp(0.0, y_max) / y_max);

    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(out, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = write!(out, r#"<text x="{left}" y="24" font-size="15">{}</text>"#, escape(title));
    // axes, grid and ticks
    for tenth in 0..=10 {
        let error = y_max * f64::from(tenth) / 10.0;
        let yy = y(error);
        let _ = write!(out, r##"<line x1="{left}" y1="{yy:.1}" x2="{right}" y2="{yy:.1}" stroke="#e5e5e5"/>"##);
        let _ = write!(out, r#"<text x="{}" y="{:.1}" text-anchor="end">{error:.2}</text>"#, left - 6.0, yy + 4.0);
    }
    let step = epochs.div_ceil(12).max(1);
    for epoch in (1..=epochs).filter(|e| (e - 1) % step == 0 || *e == epochs) {
        let xx = x(epoch);
        let _ = write!(out, r#"<text x="{xx:.1}" y="{}" text-anchor="middle">{epoch}</text>"#, bottom + 16.0);
    }
    let _ = write!(
        out,
        r##"<path d="M{left} {top} V{bottom} H{right}" fill="none" stroke="#333"/><text x="{:.1}" y="{}" text-anchor="middle">epoch</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">error (test solid, training dashed)</text>"##,
        (left + right) / 2.0,
        bottom + 36.0,
        (top + bottom) / 2.0
    );
    for (i, curve) in curves.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        for (series, dash) in [(&curve.test_error, ""), (&curve.train_error, r#" stroke-dasharray="5 4""#)] {
            if series.is_empty() {
                continue;
            }
            let points: Vec<String> =
                series.iter().enumerate().map(|(e, &err)| format!("{:.1},{:.1}", x(e + 1), y(err))).collect();
            let _ = write!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.8"{dash}><title>{}</title></polyline>"#,
                points.join(" "),
                escape(&curve.label)
            );
            // a dot where the curve ends: a point stopped early (or with one epoch) is seen to end there
            let (e, err) = (series.len(), series[series.len() - 1]);
            let fill = if dash.is_empty() { colour } else { "white" };
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{fill}" stroke="{colour}" stroke-width="1.5"/>"#,
                x(e),
                y(err)
            );
        }
        let ly = top + 8.0 + 20.0 * i as f64;
        let final_test = curve.test_error.last().map_or_else(String::new, |e| format!(" — {:.2}%", e * 100.0));
        let _ = write!(
            out,
            r#"<line x1="{}" y1="{ly:.1}" x2="{}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{:.1}">{}{}</text>"#,
            right + 20.0,
            right + 44.0,
            right + 50.0,
            ly + 4.0,
            escape(&curve.label),
            final_test
        );
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_curve_is_drawn_and_labels_are_escaped() {
        let curves = vec![
            Curve { label: "#0 workers=1 <ref>".into(), train_error: vec![0.5, 0.3], test_error: vec![0.4, 0.2] },
            Curve { label: "#1 workers=32".into(), train_error: vec![0.9], test_error: vec![] },
        ];
        let svg = svg("goyal & co", &curves);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains("goyal &amp; co") && svg.contains("&lt;ref&gt;"));
        assert!(svg.contains("20.00%"), "the final test error is in the legend");
        // each curve's end is marked, so a one-epoch curve shows
        assert_eq!(svg.matches("<circle").count(), 3);
    }
}
