//! JPEG through libjpeg-turbo (`csrc/jpeg_region.c`, linked statically): the image's size from its header,
//! and the part of it a crop needs, decoded at the smallest DCT scale that keeps the crop's resolution at
//! least the output's, as RGB or as the planes the JPEG stores (for [`super::planes`]); a JPEG with restart
//! markers (as `datasets pack` writes them) entropy-decoded by `csrc/jpeg_huffman.c` instead of libjpeg's
//! slow path. Every libjpeg call (and its longjmp on error) stays in C; an error comes back here as its
//! message.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, CStr};

#[repr(C)]
struct RtRegion {
    pixels: *mut u8,
    width: c_uint,
    height: c_uint,
    left: c_uint,
    top: c_uint,
    scale: c_uint,
    own_huffman: c_uint,
    layout: c_uint,
    chroma_h: c_uint,
    chroma_v: c_uint,
}

extern "C" {
    fn rt_jpeg_size(
        data: *const u8,
        len: c_ulong,
        width: *mut c_uint,
        height: *mut c_uint,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn rt_jpeg_region(
        data: *const u8,
        len: c_ulong,
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        out: c_uint,
        own_huffman: c_int,
        planar: c_int,
        region: *mut RtRegion,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn rt_jpeg_free(pixels: *mut u8);
    fn rt_jpeg_with_restarts(
        data: *const u8,
        len: c_ulong,
        out: *mut *mut u8,
        out_len: *mut c_ulong,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
}

/// What [`region`] decoded: `width`×`height` pixels of the image scaled by `scale`/8, starting at column
/// `left` and row `top` of the scaled image, laid out as `layout` says.
#[derive(Debug)]
pub struct Region {
    pub pixels: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub left: u32,
    pub top: u32,
    pub scale: u32,
    pub layout: Layout,
    /// Whether [`Huffman::Own`] decoded it (it does only a baseline JPEG with restart markers).
    pub own_huffman: bool,
}

/// How a [`Region`]'s pixels are laid out (`RT_RGB`, `RT_YCBCR`, `RT_GREY` in `csrc/jpeg_region.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// RGB pixels, row by row.
    Rgb,
    /// The JPEG's planes as it stores them, each row by row: Y at every pixel, then Cb and Cr, one sample
    /// for every `h`×`v` pixels (1 or 2; the last of a row or column may cover fewer), not converted.
    YCbCr { h: u32, v: u32 },
    /// One plane of grey.
    Grey,
}

impl Layout {
    /// The chroma planes' width and height for a `width`×`height` image (none for RGB or grey).
    pub fn chroma_size(self, width: u32, height: u32) -> Option<(u32, u32)> {
        match self {
            Layout::YCbCr { h, v } => Some((width.div_ceil(h), height.div_ceil(v))),
            Layout::Rgb | Layout::Grey => None,
        }
    }

    /// How many bytes a `width`×`height` image holds in this layout.
    pub fn bytes(self, width: u32, height: u32) -> usize {
        let pixels = width as usize * height as usize;
        match (self, self.chroma_size(width, height)) {
            (Layout::Rgb, _) => pixels * 3,
            (_, Some((w, h))) => pixels + 2 * w as usize * h as usize,
            _ => pixels,
        }
    }
}

/// What [`region_by`] returns the pixels as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// RGB, whatever the JPEG stores.
    Rgb,
    /// A grey JPEG, or a YCbCr one whose chroma is subsampled at the scale decoded, as its planes
    /// ([`Layout::Grey`], [`Layout::YCbCr`]); anything else as RGB (chroma at every pixel is converted
    /// faster by libjpeg than resized on its own: `csrc/jpeg_region.c`).
    Planes,
}

fn message(buffer: &[c_char]) -> String {
    // SAFETY: the C side writes a NUL-terminated message into the buffer (snprintf), which starts zeroed.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().to_string();
    format!("not a readable JPEG: {text}")
}

/// The width and height in the JPEG's header.
pub fn size(bytes: &[u8]) -> Result<(u32, u32), String> {
    let (mut width, mut height) = (0, 0);
    let mut error = [0 as c_char; 200];
    // SAFETY: `bytes` is valid for its length, the outputs are valid for writes, and the message buffer
    // for its length; the C side keeps no pointer after it returns.
    let status = unsafe {
        rt_jpeg_size(bytes.as_ptr(), bytes.len() as c_ulong, &mut width, &mut height, error.as_mut_ptr(), error.len())
    };
    if status == 0 {
        Ok((width, height))
    } else {
        Err(message(&error))
    }
}

/// Who entropy-decodes a JPEG with restart markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Huffman {
    /// `csrc/jpeg_huffman.c`: libjpeg-turbo's coefficients, without its slow path (see there why).
    Own,
    /// libjpeg-turbo's own decoder (its slow path, with markers): the reference the tests compare with.
    Libjpeg,
}

/// Decodes the crop (`x`, `y`, `w`, `h`, in the image's pixels) as it will be resized to `out`×`out`, as
/// RGB.
pub fn region(bytes: &[u8], x: f64, y: f64, w: f64, h: f64, out: u32) -> Result<Region, String> {
    region_by(bytes, x, y, w, h, out, Huffman::Own, Output::Rgb)
}

/// [`region`] as planes where the JPEG has them ([`Output::Planes`]): what the loader resizes.
pub fn planes(bytes: &[u8], x: f64, y: f64, w: f64, h: f64, out: u32) -> Result<Region, String> {
    region_by(bytes, x, y, w, h, out, Huffman::Own, Output::Planes)
}

/// [`region`], entropy-decoded by `huffman`, laid out as `output` asks.
#[allow(clippy::too_many_arguments)]
pub fn region_by(
    bytes: &[u8],
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    out: u32,
    huffman: Huffman,
    output: Output,
) -> Result<Region, String> {
    let mut raw = RtRegion {
        pixels: std::ptr::null_mut(),
        width: 0,
        height: 0,
        left: 0,
        top: 0,
        scale: 0,
        own_huffman: 0,
        layout: 0,
        chroma_h: 1,
        chroma_v: 1,
    };
    let mut error = [0 as c_char; 200];
    // SAFETY: as in `size`; on success the C side hands over `raw.pixels` (as many bytes as its layout
    // says, malloc'd), which is copied and freed below exactly once.
    let status = unsafe {
        rt_jpeg_region(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            x,
            y,
            w,
            h,
            out,
            c_int::from(huffman == Huffman::Own),
            c_int::from(output == Output::Planes),
            &mut raw,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if status != 0 {
        return Err(message(&error));
    }
    let layout = match raw.layout {
        1 => Layout::YCbCr { h: raw.chroma_h, v: raw.chroma_v },
        2 => Layout::Grey,
        _ => Layout::Rgb,
    };
    let len = layout.bytes(raw.width, raw.height);
    // SAFETY: on success `raw.pixels` points to `len` initialised bytes the C side allocated for us (its
    // planes are sized as `Layout::bytes` computes them: jpeg_region.c, rt_jpeg_region).
    let pixels = unsafe { std::slice::from_raw_parts(raw.pixels, len) }.to_vec();
    // SAFETY: the buffer came from the C side's malloc and is freed once, after the copy above.
    unsafe { rt_jpeg_free(raw.pixels) };
    Ok(Region {
        pixels,
        width: raw.width,
        height: raw.height,
        left: raw.left,
        top: raw.top,
        scale: raw.scale,
        layout,
        own_huffman: raw.own_huffman != 0,
    })
}

/// `bytes` rewritten losslessly with restart markers every few MCUs (`csrc/jpeg_restart.c`: the same
/// coefficients, so the same pixels; optimal Huffman tables), so that a crop can be decoded from the
/// intervals it covers ([`super::restart`]); None for a JPEG that is decoded whole anyway (progressive or
/// arithmetic-coded).
pub fn with_restarts(bytes: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let (mut out, mut out_len): (*mut u8, c_ulong) = (std::ptr::null_mut(), 0);
    let mut error = [0 as c_char; 200];
    // SAFETY: as in `size`; on 0 the C side hands over `out` (`out_len` bytes, malloc'd by libjpeg's memory
    // destination), copied and freed below exactly once; otherwise `out` stays null.
    let status = unsafe {
        rt_jpeg_with_restarts(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            &mut out,
            &mut out_len,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    match status {
        0 => {
            // SAFETY: on success `out` points to `out_len` initialised bytes the C side allocated.
            let rewritten = unsafe { std::slice::from_raw_parts(out, out_len as usize) }.to_vec();
            // SAFETY: allocated by malloc on the C side, freed once, after the copy above.
            unsafe { rt_jpeg_free(out) };
            Ok(Some(rewritten))
        }
        1 => Ok(None),
        _ => Err(message(&error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{random_resized_crop, restart};
    use crate::synthetic;
    use ringtrain_core::random::SplitMix64;

    fn encoded(
        pixels: &[u8],
        width: u32,
        height: u32,
        colour: jpeg_encoder::ColorType,
        sampling: jpeg_encoder::SamplingFactor,
    ) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = jpeg_encoder::Encoder::new(&mut bytes, 85);
        encoder.set_sampling_factor(sampling);
        encoder.encode(pixels, width as u16, height as u16, colour).unwrap();
        bytes
    }

    /// The JPEGs `datasets pack` makes, in each chroma layout and in grey, at awkward sizes too.
    fn marked_photographs() -> Vec<(String, u32, u32, Vec<u8>)> {
        use jpeg_encoder::{ColorType, SamplingFactor};
        let mut out = Vec::new();
        for (width, height) in [(400, 350), (333, 401), (61, 47)] {
            let rgb = synthetic::picture(4, 10, width, height, 11);
            let grey: Vec<u8> = rgb.chunks_exact(3).map(|p| p[1]).collect();
            for (name, colour, pixels, sampling) in [
                ("4:2:0", ColorType::Rgb, &rgb, SamplingFactor::R_4_2_0),
                ("4:2:2", ColorType::Rgb, &rgb, SamplingFactor::R_4_2_2),
                ("4:4:4", ColorType::Rgb, &rgb, SamplingFactor::R_4_4_4),
                ("grey", ColorType::Luma, &grey, SamplingFactor::R_4_4_4),
            ] {
                let plain = encoded(pixels, width, height, colour, sampling);
                let marked = with_restarts(&plain).unwrap().expect("a baseline JPEG is rewritten");
                out.push((format!("{name} {width}×{height}"), width, height, marked));
            }
        }
        out
    }

    /// Every crop at every DCT scale, of whole images with restart markers and of the sub-images cut from
    /// them, as RGB and as planes: the own decoder's pixels are libjpeg-turbo's, byte for byte.
    #[test]
    fn the_own_huffman_decoder_gives_libjpegs_pixels() {
        let mut rng = SplitMix64::new(7);
        for (name, width, height, marked) in marked_photographs() {
            for _ in 0..12 {
                let c = random_resized_crop(width, height, &mut rng);
                for out in [224, 100, 40, 8] {
                    let mut cases = vec![(marked.clone(), c.left, c.top)];
                    if let Some(sub) = restart::sub_image(&marked, c.left, c.top, c.width, c.height) {
                        cases.push((sub.jpeg, c.left - f64::from(sub.left), c.top - f64::from(sub.top)));
                    }
                    for ((bytes, x, y), output) in
                        cases.iter().flat_map(|case| [(case, Output::Rgb), (case, Output::Planes)])
                    {
                        let (bytes, x, y) = (bytes.as_slice(), *x, *y);
                        let own = region_by(bytes, x, y, c.width, c.height, out, Huffman::Own, output).unwrap();
                        let theirs = region_by(bytes, x, y, c.width, c.height, out, Huffman::Libjpeg, output).unwrap();
                        assert!(own.own_huffman && !theirs.own_huffman, "{name}: the own decoder was not used");
                        let shape = |r: &Region| (r.width, r.height, r.left, r.top, r.scale, r.layout);
                        assert_eq!(shape(&own), shape(&theirs), "{name} {c:?} at {out}");
                        let differing = own.pixels.iter().zip(&theirs.pixels).filter(|(a, b)| a != b).count();
                        assert_eq!(differing, 0, "{name} {c:?} at {out}: {differing} bytes differ from libjpeg's");
                    }
                }
            }
        }
    }

    /// A JPEG without markers, or progressive, stays with libjpeg (its fast path is not lost there).
    #[test]
    fn without_markers_libjpeg_decodes() {
        let pixels = synthetic::picture(1, 10, 120, 90, 3);
        let plain = synthetic::jpeg_420(&pixels, 120, 90, 90).unwrap();
        let region = region(&plain, 0.0, 0.0, 120.0, 90.0, 120).unwrap();
        assert!(!region.own_huffman);
    }

    /// Damaged data (bytes changed, the scan cut short, markers out of order) never crashes or reads
    /// outside the buffer: the decode answers, an image or an error, as libjpeg does for its part.
    #[test]
    fn damaged_data_is_decoded_or_refused_never_a_crash() {
        let (_, width, height, marked) = marked_photographs().swap_remove(0);
        let mut rng = SplitMix64::new(3);
        let scan = marked.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap() + 12;
        for round in 0..400 {
            let mut bytes = marked.clone();
            match round % 4 {
                0 => bytes.truncate(scan + rng.below((bytes.len() - scan) as u64) as usize),
                1 => {
                    // a marker where data was: an interval that ends early, or a restart out of sequence
                    let at = scan + rng.below((bytes.len() - scan - 2) as u64) as usize;
                    bytes[at] = 0xFF;
                    bytes[at + 1] = 0xD0 + rng.below(10) as u8;
                }
                _ => {
                    for _ in 0..1 + rng.below(8) {
                        let at = scan + rng.below((bytes.len() - scan) as u64) as usize;
                        bytes[at] = rng.below(256) as u8;
                    }
                }
            }
            let c = random_resized_crop(width, height, &mut rng);
            if let Ok(r) = region(&bytes, c.left, c.top, c.width, c.height, 64) {
                assert_eq!(r.pixels.len(), r.width as usize * r.height as usize * 3);
            }
            if let Ok(r) = planes(&bytes, c.left, c.top, c.width, c.height, 64) {
                assert_eq!(r.pixels.len(), r.layout.bytes(r.width, r.height));
            }
        }
    }
}
