//! Decoding an image and Goyal's augmentation, into the CHW bytes a batch is made of. A JPEG is decoded by
//! libjpeg-turbo, only as far as its crop needs ([`jpeg`]: the rows and columns of the crop, at the
//! smallest DCT scale that keeps its resolution at least the output's), into its planes as stored, each
//! resized on its own and converted to RGB at the output's size ([`planes`]); a PNG whole, by the png
//! crate.
//!
//! - Training: a random-resized crop (Szegedy et al.'s scale augmentation, as torchvision's
//!   `RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))` draws it), resized to `size`×`size`
//!   with a bilinear filter that widens as it shrinks (antialiased, as torchvision v2 and Pillow), and a
//!   horizontal flip half of the time. The draws come from a generator seeded per sample and epoch
//!   (`order::augmentation_seed`): the same crop whichever thread or process makes it.
//! - Evaluation: the shorter side resized to `size`·256/224 and the centre `size`×`size` kept (torchvision's
//!   `Resize(256)` + `CenterCrop(224)` at 224), as one crop-and-resize.
//!
//! Normalisation (per-channel mean and std) is left to the trainer, on the device: a batch of bytes is a
//! quarter of the floats it becomes.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use ringtrain_core::random::SplitMix64;

use crate::shard::ImageFormat;

pub mod jpeg;
pub mod planes;
pub mod restart;

pub use planes::Planes;

/// A decoded image, RGB, row by row.
#[derive(Debug, Clone)]
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// The largest image decoded (about 16k × 16k): a hostile file cannot ask for unbounded memory.
pub const MAX_PIXELS: u64 = 1 << 28;

/// Decodes `bytes` stored as `format` into RGB.
pub fn decode(bytes: &[u8], format: ImageFormat) -> Result<Rgb, String> {
    match format {
        ImageFormat::Jpeg => decode_jpeg(bytes),
        ImageFormat::Png => decode_png(bytes),
    }
}

fn decode_jpeg(bytes: &[u8]) -> Result<Rgb, String> {
    let (width, height) = jpeg::size(bytes)?;
    check_size(u64::from(width), u64::from(height))?;
    let whole = jpeg::region(bytes, 0.0, 0.0, f64::from(width), f64::from(height), width.max(height))?;
    expect_rgb(Rgb { width: whole.width, height: whole.height, pixels: whole.pixels })
}

/// The image's width and height, from its header.
pub fn size(bytes: &[u8], format: ImageFormat) -> Result<(u32, u32), String> {
    let (width, height) = match format {
        ImageFormat::Jpeg => jpeg::size(bytes)?,
        ImageFormat::Png => {
            let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
            let reader = decoder.read_info().map_err(|e| format!("not a readable PNG: {e}"))?;
            (reader.info().width, reader.info().height)
        }
    };
    check_size(u64::from(width), u64::from(height))?;
    Ok((width, height))
}

/// A decoded image, as the loader resizes it.
#[derive(Debug, Clone)]
pub enum Decoded {
    /// RGB pixels: a PNG, or a JPEG stored otherwise than as YCbCr or grey (CMYK, say).
    Rgb(Rgb),
    /// A JPEG's planes, as it stores them.
    Planes(Planes),
}

impl Decoded {
    /// The image's (the luma plane's) width and height.
    pub fn size(&self) -> (u32, u32) {
        match self {
            Decoded::Rgb(rgb) => (rgb.width, rgb.height),
            Decoded::Planes(planes) => (planes.width, planes.height),
        }
    }

    /// How many bytes it holds.
    pub fn bytes(&self) -> usize {
        match self {
            Decoded::Rgb(rgb) => rgb.pixels.len(),
            Decoded::Planes(planes) => planes.pixels.len(),
        }
    }
}

/// Decodes what `crop` needs of the image for an output of `out`×`out`: the decoded pixels and the crop
/// in their coordinates (a JPEG's crop region at a reduced scale, as its planes, from the crop's restart
/// intervals alone where it has them; a PNG whole, the crop as it was).
pub fn decode_for(bytes: &[u8], format: ImageFormat, crop: Crop, out: u32) -> Result<(Decoded, Crop), String> {
    match format {
        ImageFormat::Png => Ok((Decoded::Rgb(decode_png(bytes)?), crop)),
        ImageFormat::Jpeg => {
            // the crop's restart intervals alone where the JPEG has them (as `datasets pack` writes it)
            let sub = restart::sub_image(bytes, crop.left, crop.top, crop.width, crop.height);
            let (bytes, crop) = match &sub {
                Some(sub) => (
                    &sub.jpeg[..],
                    Crop { left: crop.left - f64::from(sub.left), top: crop.top - f64::from(sub.top), ..crop },
                ),
                None => (bytes, crop),
            };
            let region = jpeg::planes(bytes, crop.left, crop.top, crop.width, crop.height, out)?;
            let scale = f64::from(region.scale) / 8.0;
            let (width, height) = (region.width, region.height);
            let decoded = match region.layout {
                jpeg::Layout::Rgb => Decoded::Rgb(expect_rgb(Rgb { width, height, pixels: region.pixels })?),
                layout => Decoded::Planes(Planes { width, height, layout, pixels: region.pixels }),
            };
            let within = Crop {
                left: (crop.left * scale - f64::from(region.left)).max(0.0),
                top: (crop.top * scale - f64::from(region.top)).max(0.0),
                width: (crop.width * scale).min(f64::from(width)),
                height: (crop.height * scale).min(f64::from(height)),
                flip: crop.flip,
            };
            let within = Crop {
                width: within.width.min(f64::from(width) - within.left),
                height: within.height.min(f64::from(height) - within.top),
                ..within
            };
            Ok((decoded, within))
        }
    }
}

fn decode_png(bytes: &[u8]) -> Result<Rgb, String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(|e| format!("not a readable PNG: {e}"))?;
    let (width, height) = (reader.info().width, reader.info().height);
    check_size(u64::from(width), u64::from(height))?;
    let size = reader.output_buffer_size().ok_or("not a readable PNG: too large")?;
    let mut buffer = vec![0u8; size];
    let frame = reader.next_frame(&mut buffer).map_err(|e| format!("not a readable PNG: {e}"))?;
    let channels = frame.color_type.samples();
    let data = &buffer[..frame.buffer_size()];
    let pixels: Vec<u8> = match channels {
        3 => data.to_vec(),
        4 => data.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
        1 => data.iter().flat_map(|&g| [g, g, g]).collect(),
        2 => data.chunks_exact(2).flat_map(|p| [p[0], p[0], p[0]]).collect(),
        other => return Err(format!("not a readable PNG: {other} channels")),
    };
    expect_rgb(Rgb { width, height, pixels })
}

fn check_size(width: u64, height: u64) -> Result<(), String> {
    if width == 0 || height == 0 || width * height > MAX_PIXELS {
        return Err(format!("an image of {width}×{height} pixels (at most {MAX_PIXELS} are decoded)"));
    }
    Ok(())
}

fn expect_rgb(rgb: Rgb) -> Result<Rgb, String> {
    let expected = rgb.width as usize * rgb.height as usize * 3;
    if rgb.pixels.len() != expected {
        return Err(format!("decoded {} bytes for {}×{} RGB", rgb.pixels.len(), rgb.width, rgb.height));
    }
    Ok(rgb)
}

/// A crop of the source image, in its pixels (fractions allowed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crop {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
    pub flip: bool,
}

/// torchvision's `RandomResizedCrop.get_params` with scale (0.08, 1) and ratio (3/4, 4/3), and a flip.
pub fn random_resized_crop(width: u32, height: u32, rng: &mut SplitMix64) -> Crop {
    let (w_img, h_img) = (f64::from(width), f64::from(height));
    let area = w_img * h_img;
    let (log_low, log_high) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
    let uniform = |rng: &mut SplitMix64, low: f64, high: f64| low + (high - low) * rng.unit();
    let mut chosen = None;
    for _ in 0..10 {
        let target = area * uniform(rng, 0.08, 1.0);
        let aspect = uniform(rng, log_low, log_high).exp();
        let w = (target * aspect).sqrt().round();
        let h = (target / aspect).sqrt().round();
        if w > 0.0 && w <= w_img && h > 0.0 && h <= h_img {
            let top = rng.below((h_img - h) as u64 + 1) as f64;
            let left = rng.below((w_img - w) as u64 + 1) as f64;
            chosen = Some((left, top, w, h));
            break;
        }
    }
    let (left, top, w, h) = chosen.unwrap_or_else(|| {
        // the central crop, its ratio clamped into the range
        let ratio = w_img / h_img;
        let (w, h) = if ratio < 3.0 / 4.0 {
            (w_img, (w_img / (3.0 / 4.0)).round())
        } else if ratio > 4.0 / 3.0 {
            ((h_img * (4.0 / 3.0)).round(), h_img)
        } else {
            (w_img, h_img)
        };
        (((w_img - w) / 2.0).floor(), ((h_img - h) / 2.0).floor(), w, h)
    });
    Crop { left, top, width: w, height: h, flip: rng.unit() < 0.5 }
}

/// The whole image, unflipped (resized to the output's square: an image of that size is left as it is).
pub fn whole(width: u32, height: u32) -> Crop {
    Crop { left: 0.0, top: 0.0, width: f64::from(width), height: f64::from(height), flip: false }
}

/// The evaluation crop: the shorter side resized to `size`·256/224, the centre `size`×`size` kept.
pub fn centre_crop(width: u32, height: u32, size: u32) -> Crop {
    let resized_short = (f64::from(size) * 256.0 / 224.0).round();
    let scale = resized_short / f64::from(width.min(height));
    let side = (f64::from(size) / scale).min(f64::from(width.min(height)));
    Crop {
        left: (f64::from(width) - side) / 2.0,
        top: (f64::from(height) - side) / 2.0,
        width: side,
        height: side,
        flip: false,
    }
}

/// The calling thread's resizer and resized images, reused from one image to the next.
#[derive(Debug)]
pub struct Scratch {
    resizer: Resizer,
    rgb: Option<Image<'static>>,
    planes: planes::Buffers,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch { resizer: Resizer::new(), rgb: None, planes: planes::Buffers::default() }
    }
}

/// Crops, resizes to `size`×`size` and flips `image` as `crop` says, writing channel-major RGB bytes
/// (3×size×size) into `out`.
pub fn crop_into(image: &Decoded, crop: Crop, size: u32, scratch: &mut Scratch, out: &mut [u8]) -> Result<(), String> {
    match image {
        Decoded::Rgb(rgb) => crop_rgb_into(rgb, crop, size, scratch, out),
        Decoded::Planes(planes) => {
            planes::crop_into(planes, crop, size, &mut scratch.resizer, &mut scratch.planes, out)
        }
    }
}

fn crop_rgb_into(rgb: &Rgb, crop: Crop, size: u32, scratch: &mut Scratch, out: &mut [u8]) -> Result<(), String> {
    let src = ImageRef::new(rgb.width, rgb.height, &rgb.pixels, PixelType::U8x3).map_err(|e| e.to_string())?;
    let dst = sized(&mut scratch.rgb, size, PixelType::U8x3);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear)).crop(
        crop.left,
        crop.top,
        crop.width,
        crop.height,
    );
    scratch.resizer.resize(&src, dst, &options).map_err(|e| e.to_string())?;
    let (size, plane) = (size as usize, size as usize * size as usize);
    let (red, rest) = out.split_at_mut(plane);
    let (green, blue) = rest.split_at_mut(plane);
    // row by row, through iterators (no index checks): 7% of the loader's time as indexed loops
    for (y, row) in dst.buffer().chunks_exact(size * 3).enumerate() {
        let span = y * size..(y + 1) * size;
        let planes = (&mut red[span.clone()], &mut green[span.clone()], &mut blue[span]);
        if crop.flip {
            into_planes(planes, row.chunks_exact(3).rev());
        } else {
            into_planes(planes, row.chunks_exact(3));
        }
    }
    Ok(())
}

/// The image in `slot`, made anew unless it is `size`×`size` pixels of `pixel_type`.
fn sized<'a>(slot: &'a mut Option<Image<'static>>, size: u32, pixel_type: PixelType) -> &'a mut Image<'static> {
    match slot {
        Some(image) if image.width() == size && image.height() == size && image.pixel_type() == pixel_type => {}
        _ => *slot = Some(Image::new(size, size, pixel_type)),
    }
    slot.get_or_insert_with(|| Image::new(size, size, pixel_type))
}

/// One row of RGB pixels into its row of each channel's plane.
fn into_planes<'a>((red, green, blue): (&mut [u8], &mut [u8], &mut [u8]), pixels: impl Iterator<Item = &'a [u8]>) {
    for (((r, g), b), pixel) in red.iter_mut().zip(green).zip(blue).zip(pixels) {
        (*r, *g, *b) = (pixel[0], pixel[1], pixel[2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3-channel test picture: red grows to the right, green downwards, blue is constant.
    pub(crate) fn gradient(width: u32, height: u32) -> Rgb {
        let mut pixels = Vec::with_capacity((width * height * 3) as usize);
        for y in 0..height {
            for x in 0..width {
                pixels.extend([(x * 255 / (width - 1)) as u8, (y * 255 / (height - 1)) as u8, 77]);
            }
        }
        Rgb { width, height, pixels }
    }

    #[test]
    fn random_crops_stay_inside_the_image_within_scale_and_ratio() {
        let mut rng = SplitMix64::new(5);
        let mut flips = 0;
        for _ in 0..2000 {
            let c = random_resized_crop(400, 350, &mut rng);
            assert!(c.left >= 0.0 && c.top >= 0.0 && c.left + c.width <= 400.0 && c.top + c.height <= 350.0, "{c:?}");
            let share = c.width * c.height / (400.0 * 350.0);
            assert!((0.07..=1.0).contains(&share), "{c:?}");
            let ratio = c.width / c.height;
            assert!((0.74..=1.36).contains(&ratio), "{c:?}");
            flips += usize::from(c.flip);
        }
        assert!((900..1100).contains(&flips), "{flips} flips of 2000");
        // a strip too thin for any draw falls back to a central crop of the widest allowed ratio
        let c = random_resized_crop(1000, 10, &mut SplitMix64::new(1));
        assert_eq!((c.width, c.height), (13.0, 10.0));
    }

    #[test]
    fn evaluation_keeps_the_centre_at_the_resized_scale() {
        let c = centre_crop(500, 375, 224);
        // 375 → 256: scale 0.6827; 224 output pixels are 328.1 source pixels
        assert!((c.width - 328.125).abs() < 1e-9 && (c.left - 85.9375).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn a_crop_is_resized_flipped_and_laid_out_by_channel() {
        let rgb = Decoded::Rgb(gradient(64, 48));
        let mut scratch = Scratch::default();
        let mut out = vec![0u8; 3 * 16 * 16];
        let whole = Crop { left: 0.0, top: 0.0, width: 64.0, height: 48.0, flip: false };
        crop_into(&rgb, whole, 16, &mut scratch, &mut out).unwrap();
        let (red, green, blue) = (&out[..256], &out[256..512], &out[512..]);
        assert!(red[0] < 20 && red[15] > 235, "red grows to the right: {} {}", red[0], red[15]);
        assert!(green[0] < 20 && green[15 * 16] > 235, "green grows downwards");
        assert!(blue.iter().all(|&b| b == 77));
        let mut flipped = vec![0u8; 3 * 16 * 16];
        crop_into(&rgb, Crop { flip: true, ..whole }, 16, &mut scratch, &mut flipped).unwrap();
        assert_eq!(flipped[0], out[15], "the flip mirrors each row");
    }

    /// Decoding only a crop's region, at a reduced DCT scale, gives the picture that decoding the whole
    /// image and cropping it gives (up to the scaled IDCT's rounding).
    #[test]
    fn a_crop_decoded_alone_is_the_crop_of_the_whole_image() {
        let (width, height) = (400, 350);
        let pixels = crate::synthetic::picture(3, 10, width, height, 9);
        let bytes = crate::synthetic::jpeg(&pixels, width, height, 90).unwrap();
        let whole = decode(&bytes, ImageFormat::Jpeg).unwrap();
        assert_eq!((whole.width, whole.height), (width, height));
        let whole = Decoded::Rgb(whole);
        let mut scratch = Scratch::default();
        let mut rng = SplitMix64::new(4);
        for _ in 0..20 {
            let crop = random_resized_crop(width, height, &mut rng);
            let (mut expected, mut got) = (vec![0u8; 3 * 64 * 64], vec![0u8; 3 * 64 * 64]);
            crop_into(&whole, crop, 64, &mut scratch, &mut expected).unwrap();
            let (region, within) = decode_for(&bytes, ImageFormat::Jpeg, crop, 64).unwrap();
            assert!(region.bytes() < whole.bytes() || crop.width * crop.height >= 0.9 * 400.0 * 350.0);
            crop_into(&region, within, 64, &mut scratch, &mut got).unwrap();
            let mean: f64 =
                expected.iter().zip(&got).map(|(a, b)| f64::from(a.abs_diff(*b))).sum::<f64>() / expected.len() as f64;
            assert!(mean < 4.0, "{crop:?}: the region's crop differs by {mean:.2} levels on average");
        }
    }

    #[test]
    fn what_is_not_an_image_is_refused_with_a_reason() {
        assert!(decode(b"\xFF\xD8\xFFgarbage", ImageFormat::Jpeg).unwrap_err().contains("not a readable JPEG"));
        assert!(decode(b"\x89PNGgarbage", ImageFormat::Png).unwrap_err().contains("not a readable PNG"));
    }
}
