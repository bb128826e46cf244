//! JPEG through libjpeg-turbo (`csrc/jpeg_region.c`, linked statically): the image's size from its header,
//! and the part of it a crop needs, decoded at the smallest DCT scale that keeps the crop's resolution at
//! least the output's. Every libjpeg call (and its longjmp on error) stays in C; an error comes back here as
//! its message.

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

/// What [`region`] decoded: `width`×`height` RGB pixels of the image scaled by `scale`/8, starting at column
/// `left` and row `top` of the scaled image.
#[derive(Debug)]
pub struct Region {
    pub pixels: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub left: u32,
    pub top: u32,
    pub scale: u32,
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

/// Decodes the crop (`x`, `y`, `w`, `h`, in the image's pixels) as it will be resized to `out`×`out`.
pub fn region(bytes: &[u8], x: f64, y: f64, w: f64, h: f64, out: u32) -> Result<Region, String> {
    let mut raw = RtRegion { pixels: std::ptr::null_mut(), width: 0, height: 0, left: 0, top: 0, scale: 0 };
    let mut error = [0 as c_char; 200];
    // SAFETY: as in `size`; on success the C side hands over `raw.pixels` (width × height × 3 bytes,
    // malloc'd), which is copied and freed below exactly once.
    let status = unsafe {
        rt_jpeg_region(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            x,
            y,
            w,
            h,
            out,
            &mut raw,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if status != 0 {
        return Err(message(&error));
    }
    let len = raw.width as usize * raw.height as usize * 3;
    // SAFETY: on success `raw.pixels` points to `len` initialised bytes the C side allocated for us.
    let pixels = unsafe { std::slice::from_raw_parts(raw.pixels, len) }.to_vec();
    // SAFETY: the buffer came from the C side's malloc and is freed once, after the copy above.
    unsafe { rt_jpeg_free(raw.pixels) };
    Ok(Region { pixels, width: raw.width, height: raw.height, left: raw.left, top: raw.top, scale: raw.scale })
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
