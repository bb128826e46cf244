//! Seeded synthetic photographs, written as an image folder of JPEGs: what the data benchmark and the tests
//! pack when no real data set is at hand. Each image is a smooth two-colour gradient with a textured
//! surface (so that it costs what a photograph costs to decode: about 110 KB at 400×350 and quality 90,
//! ImageNet's average) and one filled ellipse whose colour and place depend on the class, so a network
//! can learn the classes.

use std::path::Path;

use ringtrain_core::random::SplitMix64;

/// One image of `class` (of `classes`), `width`×`height`, from `seed`: RGB bytes, row by row.
pub fn picture(class: u32, classes: u32, width: u32, height: u32, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let colour = |rng: &mut SplitMix64| [rng.below(256) as f64, rng.below(256) as f64, rng.below(256) as f64];
    let (from, to) = (colour(&mut rng), colour(&mut rng));
    // the class's mark: its hue around the colour wheel, its place along the diagonal
    let angle = f64::from(class) / f64::from(classes.max(1)) * std::f64::consts::TAU;
    let mark = [127.5 + 127.0 * angle.cos(), 127.5 + 127.0 * (angle + 2.1).cos(), 127.5 + 127.0 * (angle + 4.2).cos()];
    let along = 0.25 + 0.5 * f64::from(class) / f64::from(classes.max(1));
    let (cx, cy) =
        (along * f64::from(width) + jitter(&mut rng, 20.0), along * f64::from(height) + jitter(&mut rng, 20.0));
    let (rx, ry) = (f64::from(width) * (0.15 + 0.1 * rng.unit()), f64::from(height) * (0.15 + 0.1 * rng.unit()));
    let grain = 38.0 + 12.0 * rng.unit();
    let mut pixels = Vec::with_capacity(width as usize * height as usize * 3);
    for y in 0..height {
        for x in 0..width {
            let t = (f64::from(x) + f64::from(y)) / f64::from(width + height);
            let (dx, dy) = ((f64::from(x) - cx) / rx, (f64::from(y) - cy) / ry);
            let inside = dx * dx + dy * dy <= 1.0;
            for c in 0..3 {
                let base = if inside { mark[c] } else { from[c] + (to[c] - from[c]) * t };
                let texture =
                    grain * ((rng.unit() - 0.5) + 0.5 * ((f64::from(x) * 0.3).sin() * (f64::from(y) * 0.2).cos()));
                pixels.push((base + texture).clamp(0.0, 255.0) as u8);
            }
        }
    }
    pixels
}

fn jitter(rng: &mut SplitMix64, by: f64) -> f64 {
    (rng.unit() - 0.5) * 2.0 * by
}

/// JPEG bytes of `pixels` (RGB) at `quality`, its chroma at full resolution (4:4:4).
pub fn jpeg(pixels: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, String> {
    encode(pixels, width, height, quality, jpeg_encoder::SamplingFactor::R_4_4_4)
}

/// JPEG bytes of `pixels` (RGB) at `quality`, its chroma at half resolution each way (4:2:0, what cameras
/// and most encoders write by default).
pub fn jpeg_420(pixels: &[u8], width: u32, height: u32, quality: u8) -> Result<Vec<u8>, String> {
    encode(pixels, width, height, quality, jpeg_encoder::SamplingFactor::R_4_2_0)
}

fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    quality: u8,
    sampling: jpeg_encoder::SamplingFactor,
) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let (w, h) = (u16::try_from(width).map_err(|e| e.to_string())?, u16::try_from(height).map_err(|e| e.to_string())?);
    let mut encoder = jpeg_encoder::Encoder::new(&mut bytes, quality);
    encoder.set_sampling_factor(sampling);
    encoder.encode(pixels, w, h, jpeg_encoder::ColorType::Rgb).map_err(|e| e.to_string())?;
    Ok(bytes)
}

/// How a JPEG stores its chroma.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chroma {
    /// At full resolution (4:4:4).
    Full,
    /// At half resolution each way (4:2:0): what cameras write, and most of ImageNet's photographs.
    Half,
}

/// Writes `per_class` JPEGs of `width`×`height` (±10%, as photographs vary) into each of `classes` class
/// folders under `dir` (`dir/class-NNN/NNNNNN.jpg`), their chroma stored as `chroma` says; returns the
/// bytes written.
pub fn image_folder(
    dir: &Path,
    classes: u32,
    per_class: u32,
    (width, height): (u32, u32),
    chroma: Chroma,
    seed: u64,
) -> std::io::Result<u64> {
    let mut written = 0;
    for class in 0..classes {
        let folder = dir.join(format!("class-{class:03}"));
        std::fs::create_dir_all(&folder)?;
        for i in 0..per_class {
            let sample_seed = seed ^ (u64::from(class) << 32) ^ u64::from(i);
            let mut rng = SplitMix64::new(sample_seed);
            let w = width * (90 + rng.below(21) as u32) / 100;
            let h = height * (90 + rng.below(21) as u32) / 100;
            let pixels = picture(class, classes, w, h, sample_seed);
            let bytes = match chroma {
                Chroma::Full => jpeg(&pixels, w, h, 90),
                Chroma::Half => jpeg_420(&pixels, w, h, 90),
            };
            let bytes = bytes.map_err(std::io::Error::other)?;
            std::fs::write(folder.join(format!("{i:06}.jpg")), &bytes)?;
            written += bytes.len() as u64;
        }
    }
    Ok(written)
}
