//! A JPEG's planes, as it stores them, into the loader's RGB output: each plane cropped and resized to the
//! output on its own (chroma from the resolution it was stored at: 4:2:0's Cb and Cr from a quarter of the
//! samples), then YCbCr converted to RGB for the output's pixels alone.
//!
//! Why: through libjpeg's RGB output, a 4:2:0 crop of an ImageNet-sized photograph had its chroma upsampled
//! to every pixel (jdsample.c), converted to RGB pixel by pixel (jdcolor.c), and then resized as three full
//! channels, most of the work undone by the resize; here only the samples the JPEG holds are resized, and
//! only the output's 224×224 are converted. The result is the same picture: the chroma plane is the same
//! area of the image as the luma plane (a chroma sample's centre is the centre of the pixels it covers, as
//! JFIF places it), so resizing it from its own grid samples the same continuous image that upsampling
//! first would (up to the two filters' rounding; `tests` compare with the RGB path).

#![allow(unsafe_code)]

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::jpeg::Layout;
use super::Crop;

/// A JPEG's region as planes ([`Layout::YCbCr`] or [`Layout::Grey`]): `width`×`height` luma samples, then
/// the chroma planes where it has them.
#[derive(Debug, Clone)]
pub struct Planes {
    pub width: u32,
    pub height: u32,
    pub layout: Layout,
    pub pixels: Vec<u8>,
}

/// The calling thread's buffers, reused from one image to the next.
#[derive(Debug, Default)]
pub(super) struct Buffers {
    staging: Staging,
    /// The luma rows resized across (`size` samples each), and the chroma rows (Cb's and Cr's side by side).
    across: [Vec<u8>; 2],
    /// Y resized to `size`×`size`, and Cb and Cr (side by side, `2·size`×`size`).
    resized: [Vec<u8>; 2],
}

/// Rows packed four to a row of 4-channel pixels, those resized across, and four of them unpacked.
#[derive(Debug, Default)]
struct Staging {
    packed: Vec<u8>,
    packed_across: Vec<u8>,
    unpacked: Vec<u8>,
}

/// Crops and resizes each plane of `planes` to `size`×`size` as `crop` (in luma pixels) says, converts the
/// result to RGB and writes it channel-major (3×size×size) into `out`, mirrored if `crop.flip`.
pub(super) fn crop_into(
    planes: &Planes,
    crop: Crop,
    size: u32,
    resizer: &mut Resizer,
    buffers: &mut Buffers,
    out: &mut [u8],
) -> Result<(), String> {
    let (width, height) = (planes.width, planes.height);
    let (luma, chroma) = planes.pixels.split_at(width as usize * height as usize);
    let side = size as usize;
    let plane = side * side;
    let Buffers { staging, across: [luma_across, chroma_across], resized } = buffers;
    let [y, chroma_resized] = resized;
    let one_after_another = |row: usize| row * side;
    across(luma, width, crop.left, crop.width, size, resizer, staging, luma_across, one_after_another)?;
    down(luma_across, size, height, crop.top, crop.height, size, resizer, y)?;
    let (red, rest) = out.split_at_mut(plane);
    let (green, blue) = rest.split_at_mut(plane);
    match (planes.layout, planes.layout.chroma_size(width, height)) {
        (Layout::YCbCr { h, v }, Some((chroma_width, chroma_height))) => {
            let (h, v) = (f64::from(h), f64::from(v));
            let (left, top) = (crop.left / h, crop.top / v);
            let span_across = (crop.width / h).min(f64::from(chroma_width) - left);
            let span_down = (crop.height / v).min(f64::from(chroma_height) - top);
            // Cb's rows then Cr's in `chroma`, resized across together into rows of Cb and Cr side by side,
            // which are resized down together
            let rows = chroma_height as usize;
            let side_by_side = |row: usize| if row < rows { row * 2 * side } else { (row - rows) * 2 * side + side };
            across(chroma, chroma_width, left, span_across, size, resizer, staging, chroma_across, side_by_side)?;
            down(chroma_across, 2 * size, chroma_height, top, span_down, size, resizer, chroma_resized)?;
            let rows = chroma_resized.chunks_exact(2 * side).zip(y.chunks_exact(side));
            let outputs = red.chunks_exact_mut(side).zip(green.chunks_exact_mut(side)).zip(blue.chunks_exact_mut(side));
            for ((chroma, y), ((r, g), b)) in rows.zip(outputs) {
                let (cb, cr) = chroma.split_at(side);
                ycc_to_rgb(y, cb, cr, r, g, b);
            }
        }
        _ => {
            for channel in [red, green, blue] {
                channel.copy_from_slice(&y[..plane]);
            }
        }
    }
    if crop.flip {
        // every row of the three planes
        out[..3 * plane].chunks_exact_mut(side).for_each(<[u8]>::reverse);
    }
    Ok(())
}

/// Resizes every row of `rows` (each `width` samples) across: the span from `left`, `span` samples wide,
/// to `size` samples, into `into`, row `r` at `place(r)`. Four rows at a time, as the four channels of one
/// row of 4-channel pixels: fast_image_resize's one-channel path is scalar for filters shorter than 8 taps
/// (a shrink under 4×), and took 30% of the loader's time on 4:2:0 crops; its 4-channel path multiplies a
/// pixel's channels at once.
#[allow(clippy::too_many_arguments)]
fn across(
    rows: &[u8],
    width: u32,
    left: f64,
    span: f64,
    size: u32,
    resizer: &mut Resizer,
    staging: &mut Staging,
    into: &mut Vec<u8>,
    place: impl Fn(usize) -> usize,
) -> Result<(), String> {
    let Staging { packed, packed_across, unpacked } = staging;
    let (w, side) = (width as usize, size as usize);
    let count = rows.len() / w;
    let groups = count.div_ceil(4);
    // a last group short of four rows repeats its last row
    let row = |i: usize| &rows[i.min(count - 1) * w..][..w];
    packed.resize(groups * w * 4, 0);
    for (group, pixels) in packed.chunks_exact_mut(w * 4).enumerate() {
        interleave([row(4 * group), row(4 * group + 1), row(4 * group + 2), row(4 * group + 3)], pixels);
    }
    let src = ImageRef::new(width, groups as u32, packed, PixelType::U8x4).map_err(|e| e.to_string())?;
    packed_across.resize(groups * side * 4, 0);
    let mut dst =
        Image::from_slice_u8(size, groups as u32, packed_across, PixelType::U8x4).map_err(|e| e.to_string())?;
    // the fourth channel is a row like the others, not an alpha to multiply the rest by
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(left, 0.0, span, groups as f64)
        .use_alpha(false);
    resizer.resize(&src, &mut dst, &options).map_err(|e| e.to_string())?;
    into.resize((0..count).map(|r| place(r) + side).max().unwrap_or(0), 0);
    unpacked.resize(4 * side, 0);
    for (group, pixels) in packed_across.chunks_exact(side * 4).enumerate() {
        let (a, rest) = unpacked.split_at_mut(side);
        let (b, rest) = rest.split_at_mut(side);
        let (c, d) = rest.split_at_mut(side);
        deinterleave(pixels, [a, b, c, d]);
        for (i, row) in unpacked.chunks_exact(side).enumerate().take(count - 4 * group) {
            into[place(4 * group + i)..][..side].copy_from_slice(row);
        }
    }
    Ok(())
}

/// Resizes `rows` (`height` of them, each `width` samples) down: the span from `top`, `span` rows high, to
/// `size` rows, into `into` (`width`×`size`).
#[allow(clippy::too_many_arguments)]
fn down(
    rows: &[u8],
    width: u32,
    height: u32,
    top: f64,
    span: f64,
    size: u32,
    resizer: &mut Resizer,
    into: &mut Vec<u8>,
) -> Result<(), String> {
    let src = ImageRef::new(width, height, &rows[..width as usize * height as usize], PixelType::U8)
        .map_err(|e| e.to_string())?;
    into.resize(width as usize * size as usize, 0);
    let mut dst = Image::from_slice_u8(width, size, into, PixelType::U8).map_err(|e| e.to_string())?;
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear)).crop(
        0.0,
        top,
        f64::from(width),
        span,
    );
    resizer.resize(&src, &mut dst, &options).map_err(|e| e.to_string())
}

/// Four rows of samples into one row of 4-channel pixels (`out`: 4 bytes for each sample of a row).
fn interleave(rows: [&[u8]; 4], out: &mut [u8]) {
    let [a, b, c, d] = rows;
    let n = out.len() / 4;
    let mut x = 0;
    #[cfg(target_arch = "x86_64")]
    while x + 16 <= n {
        use std::arch::x86_64::*;
        let (a, b, c, d) = (&a[x..x + 16], &b[x..x + 16], &c[x..x + 16], &d[x..x + 16]);
        let out = &mut out[4 * x..4 * x + 64];
        // SAFETY: SSE2 is part of x86-64; every load reads 16 bytes of a 16-byte slice and every store
        // writes 16 bytes inside the 64-byte slice `out`.
        unsafe {
            let load = |s: &[u8]| _mm_loadu_si128(s.as_ptr().cast());
            let (a, b, c, d) = (load(a), load(b), load(c), load(d));
            let (ab_low, ab_high) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
            let (cd_low, cd_high) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
            let base = out.as_mut_ptr();
            let at = |i: usize| base.add(16 * i).cast::<__m128i>();
            _mm_storeu_si128(at(0), _mm_unpacklo_epi16(ab_low, cd_low));
            _mm_storeu_si128(at(1), _mm_unpackhi_epi16(ab_low, cd_low));
            _mm_storeu_si128(at(2), _mm_unpacklo_epi16(ab_high, cd_high));
            _mm_storeu_si128(at(3), _mm_unpackhi_epi16(ab_high, cd_high));
        }
        x += 16;
    }
    for x in x..n {
        out[4 * x..4 * x + 4].copy_from_slice(&[a[x], b[x], c[x], d[x]]);
    }
}

/// One row of 4-channel pixels into four rows of samples, one per channel: [`interleave`] undone.
fn deinterleave(pixels: &[u8], rows: [&mut [u8]; 4]) {
    let [a, b, c, d] = rows;
    let n = pixels.len() / 4;
    let mut x = 0;
    #[cfg(target_arch = "x86_64")]
    while x + 16 <= n {
        use std::arch::x86_64::*;
        let pixels = &pixels[4 * x..4 * x + 64];
        let (a, b, c, d) = (&mut a[x..x + 16], &mut b[x..x + 16], &mut c[x..x + 16], &mut d[x..x + 16]);
        // SAFETY: SSE2 is part of x86-64; the loads read 16 bytes each inside the 64-byte slice `pixels`,
        // and each store writes one 16-byte slice. Three rounds of byte unpacking gather each channel's
        // bytes (of pixels 0–7 and 8–15), a 64-bit unpack joins the halves.
        unsafe {
            let load = |i: usize| _mm_loadu_si128(pixels.as_ptr().add(16 * i).cast());
            let (p0, p1, p2, p3) = (load(0), load(1), load(2), load(3));
            let (s0, s1) = (_mm_unpacklo_epi8(p0, p1), _mm_unpackhi_epi8(p0, p1));
            let (s2, s3) = (_mm_unpacklo_epi8(p2, p3), _mm_unpackhi_epi8(p2, p3));
            let (t0, t1) = (_mm_unpacklo_epi8(s0, s1), _mm_unpackhi_epi8(s0, s1));
            let (t2, t3) = (_mm_unpacklo_epi8(s2, s3), _mm_unpackhi_epi8(s2, s3));
            let (u0, u1) = (_mm_unpacklo_epi8(t0, t1), _mm_unpackhi_epi8(t0, t1));
            let (u2, u3) = (_mm_unpacklo_epi8(t2, t3), _mm_unpackhi_epi8(t2, t3));
            _mm_storeu_si128(a.as_mut_ptr().cast(), _mm_unpacklo_epi64(u0, u2));
            _mm_storeu_si128(b.as_mut_ptr().cast(), _mm_unpackhi_epi64(u0, u2));
            _mm_storeu_si128(c.as_mut_ptr().cast(), _mm_unpacklo_epi64(u1, u3));
            _mm_storeu_si128(d.as_mut_ptr().cast(), _mm_unpackhi_epi64(u1, u3));
        }
        x += 16;
    }
    for x in x..n {
        let pixel = &pixels[4 * x..4 * x + 4];
        (a[x], b[x], c[x], d[x]) = (pixel[0], pixel[1], pixel[2], pixel[3]);
    }
}

/// libjpeg's YCbCr → RGB (jdcolor.c: JFIF's coefficients in 16-bit fixed point, rounded as it rounds).
fn ycc_to_rgb(y: &[u8], cb: &[u8], cr: &[u8], red: &mut [u8], green: &mut [u8], blue: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above; the function is safe Rust compiled for it.
        unsafe { ycc_to_rgb_avx2(y, cb, cr, red, green, blue) };
        return;
    }
    ycc_to_rgb_portable(y, cb, cr, red, green, blue);
}

/// [`ycc_to_rgb_portable`] compiled with AVX2, whose 32-bit multiplies it vectorises into (x86-64's
/// baseline, SSE2, has none: 8 pixels an instruction instead of one).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn ycc_to_rgb_avx2(y: &[u8], cb: &[u8], cr: &[u8], red: &mut [u8], green: &mut [u8], blue: &mut [u8]) {
    ycc_to_rgb_portable(y, cb, cr, red, green, blue);
}

#[inline(always)]
fn ycc_to_rgb_portable(y: &[u8], cb: &[u8], cr: &[u8], red: &mut [u8], green: &mut [u8], blue: &mut [u8]) {
    const HALF: i32 = 1 << 15;
    // FIX(x) = round(x · 2^16), as jdcolor.c's build_ycc_rgb_table
    const CR_R: i32 = 91_881; // 1.40200
    const CB_B: i32 = 116_130; // 1.77200
    const CB_G: i32 = -22_554; // -0.34414
    const CR_G: i32 = -46_802; // -0.71414
    let n = red.len().min(green.len()).min(blue.len()).min(y.len()).min(cb.len()).min(cr.len());
    let (y, cb, cr) = (&y[..n], &cb[..n], &cr[..n]);
    let (red, green, blue) = (&mut red[..n], &mut green[..n], &mut blue[..n]);
    for i in 0..n {
        let (luma, b, r) = (i32::from(y[i]), i32::from(cb[i]) - 128, i32::from(cr[i]) - 128);
        red[i] = (luma + ((CR_R * r + HALF) >> 16)).clamp(0, 255) as u8;
        green[i] = (luma + ((CB_G * b + CR_G * r + HALF) >> 16)).clamp(0, 255) as u8;
        blue[i] = (luma + ((CB_B * b + HALF) >> 16)).clamp(0, 255) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{crop_into as crop_image_into, decode_for, jpeg, random_resized_crop, Decoded, Rgb, Scratch};
    use crate::shard::ImageFormat;
    use crate::synthetic;
    use ringtrain_core::random::SplitMix64;

    /// For every chroma layout, with and without restart markers, random crops (flipped or not, shrunk and
    /// enlarged) come out of the planes as the RGB path makes them from libjpeg's RGB pixels: the same
    /// picture, up to the chroma filters' rounding. Chroma at every pixel (4:4:4) stays with RGB.
    #[test]
    fn the_planes_give_the_rgb_paths_picture() {
        use jpeg_encoder::{ColorType, SamplingFactor};
        let mut rng = SplitMix64::new(12);
        let mut scratch = Scratch::default();
        let mut apart = std::collections::BTreeMap::<_, (f64, u32)>::new();
        for (width, height) in [(400, 350), (333, 401), (61, 47)] {
            let rgb = synthetic::picture(4, 10, width, height, 5);
            let grey: Vec<u8> = rgb.chunks_exact(3).map(|p| p[1]).collect();
            for (name, colour, pixels, sampling, layout) in [
                ("4:2:0", ColorType::Rgb, &rgb, SamplingFactor::R_4_2_0, Layout::YCbCr { h: 2, v: 2 }),
                ("4:2:2", ColorType::Rgb, &rgb, SamplingFactor::R_4_2_2, Layout::YCbCr { h: 2, v: 1 }),
                ("4:4:4", ColorType::Rgb, &rgb, SamplingFactor::R_4_4_4, Layout::YCbCr { h: 1, v: 1 }),
                ("grey", ColorType::Luma, &grey, SamplingFactor::R_4_4_4, Layout::Grey),
            ] {
                let mut plain = Vec::new();
                let mut encoder = jpeg_encoder::Encoder::new(&mut plain, 90);
                encoder.set_sampling_factor(sampling);
                encoder.encode(pixels, width as u16, height as u16, colour).unwrap();
                let marked = jpeg::with_restarts(&plain).unwrap().unwrap();
                let whole = jpeg::region(&plain, 0.0, 0.0, f64::from(width), f64::from(height), width.max(height));
                let whole = whole.unwrap();
                let whole = Decoded::Rgb(Rgb { width, height, pixels: whole.pixels });
                for _ in 0..8 {
                    let crop = random_resized_crop(width, height, &mut rng);
                    for size in [224, 64, 16] {
                        let side = size as usize;
                        let mut expected = vec![0u8; 3 * side * side];
                        crop_image_into(&whole, crop, size, &mut scratch, &mut expected).unwrap();
                        for bytes in [&plain, &marked] {
                            let (image, within) = decode_for(bytes, ImageFormat::Jpeg, crop, size).unwrap();
                            // at 224 every crop here decodes at 8/8; at a reduced scale, chroma comes from a
                            // larger IDCT at every pixel (jdmaster.c), and such an image goes through RGB
                            match (&image, layout) {
                                (Decoded::Rgb(_), Layout::YCbCr { h: 1, v: 1 }) => {}
                                (Decoded::Rgb(_), Layout::YCbCr { .. }) => assert!(size < 224, "{name}: RGB at {size}"),
                                (Decoded::Planes(planes), _) => {
                                    assert_ne!(layout, Layout::YCbCr { h: 1, v: 1 }, "{name}: planes at 4:4:4");
                                    if size == 224 {
                                        assert_eq!(planes.layout, layout, "{name}");
                                    }
                                }
                                (Decoded::Rgb(_), _) => panic!("{name}: not decoded as planes"),
                            }
                            let mut got = vec![0u8; 3 * side * side];
                            crop_image_into(&image, within, size, &mut scratch, &mut got).unwrap();
                            let levels: u64 = expected.iter().zip(&got).map(|(a, b)| u64::from(a.abs_diff(*b))).sum();
                            let mean = levels as f64 / got.len() as f64;
                            assert!(mean < 4.0, "{name} {width}×{height} {crop:?} at {size}: {mean:.2} levels apart");
                            let sum = apart.entry((name, size)).or_default();
                            (sum.0, sum.1) = (sum.0 + mean, sum.1 + 1);
                        }
                    }
                }
            }
        }
        // on average within 2 levels (measured 0.7 at 4:4:4 to 1.8 at 4:2:0: the chroma filters and, at a
        // crop's edge, a region without the pixels beyond it); chroma cropped a quarter of a sample off
        // averages 3.4–3.9
        for ((name, size), (sum, count)) in apart {
            let mean = sum / f64::from(count);
            assert!(mean < 2.2, "{name} at {size}: {mean:.2} levels apart on average");
        }
    }

    /// Rows packed into 4-channel pixels and back, at every length around the 16-pixel SIMD blocks.
    #[test]
    fn rows_interleave_and_come_back() {
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 224, 333] {
            let rows: Vec<Vec<u8>> = (0..4).map(|r| (0..n).map(|x| (x * 7 + r * 61) as u8).collect()).collect();
            let mut packed = vec![0u8; 4 * n];
            interleave([&rows[0], &rows[1], &rows[2], &rows[3]], &mut packed);
            for x in 0..n {
                assert_eq!(
                    packed[4 * x..4 * x + 4],
                    [rows[0][x], rows[1][x], rows[2][x], rows[3][x]],
                    "{n}: pixel {x}"
                );
            }
            let mut back = vec![vec![0u8; n]; 4];
            let [a, b, c, d] = &mut back[..] else { unreachable!() };
            deinterleave(&packed, [a, b, c, d]);
            assert_eq!(back, rows, "{n}");
        }
    }

    /// The conversion is libjpeg's: grey stays grey, and the primaries come out where JFIF puts them.
    #[test]
    fn ycbcr_converts_as_libjpeg_does() {
        let convert = |y: u8, cb: u8, cr: u8| {
            let (mut r, mut g, mut b) = ([0u8; 1], [0u8; 1], [0u8; 1]);
            ycc_to_rgb(&[y], &[cb], &[cr], &mut r, &mut g, &mut b);
            (r[0], g[0], b[0])
        };
        assert_eq!(convert(0, 128, 128), (0, 0, 0));
        assert_eq!(convert(200, 128, 128), (200, 200, 200));
        // pure red as a JFIF encoder writes it: Y 76, Cb 85, Cr 255
        assert_eq!(convert(76, 85, 255), (254, 0, 0));
        // out of range clamps
        assert_eq!(convert(255, 255, 255), (255, 121, 255));
        // the AVX2 and the portable loops agree on every pixel of a long row
        let y: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
        let cb: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 256) as u8).collect();
        let cr: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 256) as u8).collect();
        let mut fast = (vec![0u8; 1000], vec![0u8; 1000], vec![0u8; 1000]);
        let mut slow = fast.clone();
        ycc_to_rgb(&y, &cb, &cr, &mut fast.0, &mut fast.1, &mut fast.2);
        ycc_to_rgb_portable(&y, &cb, &cr, &mut slow.0, &mut slow.1, &mut slow.2);
        assert_eq!(fast, slow);
    }
}
