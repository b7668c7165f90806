//! Plots as standalone SVG, written by hand (a few dozen elements; no plotting dependency):
//! latency CDFs (`lat`, `mixed`) and bandwidth against size (`bw --sizes`).
use std::fmt::Write;

use hdrhistogram::Histogram;

const W: f64 = 640.0;
const H: f64 = 400.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 50.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A chart with a log-scale x axis from `x0` to `x1` and a linear y axis from 0 to `y1`.
struct Frame {
    out: String,
    x0: f64,
    x1: f64,
    y1: f64,
}

impl Frame {
    fn new(title: &str, xlabel: &str, ylabel: &str, x0: f64, x1: f64, y1: f64) -> Frame {
        let (x0, x1) = (x0.max(1e-9), x1.max(x0 * 10.0));
        let mut out = String::new();
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>
<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="black"/>
"#,
            W / 2.0,
            esc(title),
            L + (W - L - R) / 2.0,
            H - 12.0,
            esc(xlabel),
            T + (H - T - B) / 2.0,
            T + (H - T - B) / 2.0,
            esc(ylabel),
            W - L - R,
            H - T - B
        );
        let mut f = Frame { out, x0, x1, y1: y1.max(1e-9) };
        // Decades on x, fifths on y.
        let mut d = 10f64.powf(x0.log10().floor());
        while d <= x1 * 1.0001 {
            if d >= x0 * 0.9999 {
                let x = f.x(d);
                let _ = writeln!(
                    f.out,
                    r##"<line x1="{x:.1}" y1="{T}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                    H - B,
                    H - B + 16.0,
                    short(d)
                );
            }
            d *= 10.0;
        }
        for k in 0..=5 {
            let v = f.y1 * k as f64 / 5.0;
            let y = f.y(v);
            let _ = writeln!(
                f.out,
                r##"<line x1="{L}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - R,
                L - 6.0,
                y + 4.0,
                short(v)
            );
        }
        f
    }

    fn x(&self, v: f64) -> f64 {
        let t = (v.max(self.x0).log10() - self.x0.log10()) / (self.x1.log10() - self.x0.log10());
        L + t.clamp(0.0, 1.0) * (W - L - R)
    }

    fn y(&self, v: f64) -> f64 {
        H - B - (v / self.y1).clamp(0.0, 1.0) * (H - T - B)
    }

    fn series(&mut self, i: usize, name: &str, pts: &[(f64, f64)]) {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> =
            pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", self.x(x), self.y(y))).collect();
        let _ = writeln!(
            self.out,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in pts.iter().filter(|_| pts.len() <= 24) {
            let _ = writeln!(
                self.out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                self.x(x),
                self.y(y)
            );
        }
        let ly = T + 16.0 + 16.0 * i as f64;
        let _ = writeln!(
            self.out,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            L + 10.0,
            L + 30.0,
            L + 36.0,
            ly + 4.0,
            esc(name)
        );
    }

    fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

fn short(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{}G", v / 1e9),
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v if v >= 1.0 || v == 0.0 => format!("{}", (v * 100.0).round() / 100.0),
        v => format!("{v:.2}"),
    }
}

/// Latency CDFs (microseconds on a log axis) of one or more histograms in nanoseconds.
pub fn latency_cdf(title: &str, series: &[(&str, &Histogram<u64>)]) -> String {
    let lo = series.iter().map(|(_, h)| h.min().max(1) as f64 / 1000.0).fold(f64::MAX, f64::min);
    let hi = series.iter().map(|(_, h)| h.max() as f64 / 1000.0).fold(0.0, f64::max);
    let mut f = Frame::new(title, "latency (µs, log scale)", "fraction of ops at or below", lo, hi, 1.0);
    for (i, (name, h)) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = (0..=200)
            .map(|k| {
                let q = 1.0 - 0.5f64.powf(k as f64 / 20.0);
                (h.value_at_quantile(q) as f64 / 1000.0, q)
            })
            .collect();
        f.series(i, name, &pts);
    }
    f.finish()
}

/// Bandwidth (Gb/s) against message size (bytes, log axis), one line per series.
pub fn bandwidth(title: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| x));
    let (lo, hi) = xs.fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    let top = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y)).fold(0.0, f64::max) * 1.1;
    let mut f = Frame::new(title, "size (bytes, log scale)", "Gb/s", lo, hi, top);
    for (i, (name, pts)) in series.iter().enumerate() {
        f.series(i, name, pts);
    }
    f.finish()
}

/// Write `svg` to `path`, saying where on stderr.
pub fn save(path: &str, svg: &str) -> Result<(), crate::conn::BoxErr> {
    std::fs::write(path, svg)?;
    eprintln!("wrote {path}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for v in [900u64, 1000, 1200, 5000, 90_000] {
            h.record(v).unwrap();
        }
        let s = latency_cdf("t <&>", &[("alone", &h), ("mixed", &h)]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("t &lt;&amp;&gt;") && s.matches("<polyline").count() == 2);
        let b = bandwidth("bw", &[("rdmalane", vec![(4096.0, 10.0), (65536.0, 50.0)])]);
        assert!(b.contains("<circle") && b.contains("Gb/s"));
    }
}
