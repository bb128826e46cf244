//! A crop of a JPEG that has restart markers, as a JPEG of its own: only the restart intervals the crop
//! covers, so that libjpeg entropy-decodes the crop's area and not every row above the crop's bottom.
//!
//! Why: entropy (Huffman) decoding is 80% of decoding a crop of a 400×350 photograph (measured
//! 2026-12-07), and it is sequential within a restart interval: without markers, a crop in the lower right
//! costs nearly the whole image. A restart interval starts byte-aligned with its DC predictions reset, so
//! a sequence of whole intervals, renumbered, is a valid scan by itself. `datasets pack` rewrites JPEGs
//! with a marker every few MCUs, their intervals never straddling a row (`csrc/jpeg_restart.c`); then a
//! random-resized crop entropy-decodes about half of an image on average instead of 86%.
//!
//! Only a baseline (Huffman, sequential) JPEG of one scan whose restart interval divides its MCUs per row
//! qualifies; anything else (no markers, progressive, a marker out of sequence, data that ends early) gets
//! `None` and is decoded as before, whole rows, by the same libjpeg that reports what is wrong with it.

/// A crop's restart intervals as a JPEG, and where that JPEG's top-left pixel is in the image.
#[derive(Debug)]
pub struct SubImage {
    pub jpeg: Vec<u8>,
    pub left: u32,
    pub top: u32,
}

/// What the headers say of the scan.
struct Layout {
    width: u32,
    height: u32,
    mcu_width: u32,
    mcu_height: u32,
    /// MCUs per restart interval.
    interval: u32,
    /// Where the SOF segment starts and ends (its marker to its last byte), to be rewritten.
    sof: (usize, usize),
    /// Where the entropy-coded data starts (after SOS).
    data: usize,
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(*bytes.get(at)?) << 8 | u32::from(*bytes.get(at + 1)?))
}

/// Reads the markers up to the scan; None for a JPEG this cannot cut.
fn layout(jpeg: &[u8]) -> Option<Layout> {
    if jpeg.get(..2)? != [0xFF, 0xD8] {
        return None;
    }
    let (mut at, mut frame, mut interval) = (2usize, None, 0u32);
    loop {
        if *jpeg.get(at)? != 0xFF {
            return None;
        }
        let marker = *jpeg.get(at + 1)?;
        if marker == 0xFF {
            at += 1; // fill byte
            continue;
        }
        let length = u16_at(jpeg, at + 2)? as usize;
        let end = at + 2 + length;
        if length < 2 || end > jpeg.len() {
            return None;
        }
        match marker {
            // baseline or extended sequential, Huffman-coded
            0xC0 | 0xC1 => frame = Some((at, end)),
            // any other frame: progressive, lossless, arithmetic, hierarchical
            0xC2 | 0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => return None,
            0xDD => interval = u16_at(jpeg, at + 4)?,
            0xDA => {
                let (sof_start, sof_end) = frame?;
                let components = usize::from(*jpeg.get(sof_start + 9)?);
                let in_scan = usize::from(*jpeg.get(at + 4)?);
                if interval == 0 || components == 0 || (in_scan != components) {
                    return None;
                }
                let (height, width) = (u16_at(jpeg, sof_start + 5)?, u16_at(jpeg, sof_start + 7)?);
                let (mut max_h, mut max_v) = (1u32, 1u32);
                for c in 0..components {
                    let sampling = u32::from(*jpeg.get(sof_start + 11 + 3 * c)?);
                    max_h = max_h.max(sampling >> 4);
                    max_v = max_v.max(sampling & 15);
                }
                // one component is not interleaved: its MCU is one 8×8 block, whatever its sampling says
                let (mcu_width, mcu_height) = if components == 1 { (8, 8) } else { (8 * max_h, 8 * max_v) };
                if width == 0 || height == 0 || max_h > 4 || max_v > 4 {
                    return None;
                }
                if width.div_ceil(mcu_width) % interval != 0 {
                    return None;
                }
                return Some(Layout {
                    width,
                    height,
                    mcu_width,
                    mcu_height,
                    interval,
                    sof: (sof_start, sof_end),
                    data: end,
                });
            }
            // markers without a length before the scan do not exist in a valid file
            0xD0..=0xD9 | 0x01 => return None,
            _ => {}
        }
        at = end;
    }
}

/// The entropy-coded data of the first `count` restart intervals (each without its marker), from `at`;
/// None when the data ends sooner or a marker is out of sequence.
fn intervals(jpeg: &[u8], mut at: usize, count: usize) -> Option<Vec<(usize, usize)>> {
    let mut found = Vec::with_capacity(count);
    let mut start = at;
    while found.len() < count {
        let next = at + memchr::memchr(0xFF, jpeg.get(at..)?)?;
        let mut marker_at = next + 1;
        while *jpeg.get(marker_at)? == 0xFF {
            marker_at += 1; // fill bytes before a marker
        }
        match jpeg[marker_at] {
            0x00 => at = marker_at + 1, // a stuffed 0xFF byte of data
            m @ 0xD0..=0xD7 => {
                if usize::from(m - 0xD0) != found.len() % 8 {
                    return None;
                }
                found.push((start, next));
                start = marker_at + 1;
                at = start;
            }
            // the scan's end (EOI or another marker): the last interval ends here
            _ => {
                found.push((start, next));
                return (found.len() == count).then_some(found);
            }
        }
    }
    Some(found)
}

/// The restart intervals covering the crop (`x`, `y`, `w`, `h`, in the image's pixels) as a JPEG, or None
/// when `jpeg` cannot be cut (see the module's doc).
pub fn sub_image(jpeg: &[u8], x: f64, y: f64, w: f64, h: f64) -> Option<SubImage> {
    let layout = layout(jpeg)?;
    let span = layout.interval * layout.mcu_width;
    let per_row = layout.width.div_ceil(layout.mcu_width) / layout.interval;
    let rows = layout.height.div_ceil(layout.mcu_height);
    let clamp = |v: f64, limit: u32| (v.max(0.0) as u32).min(limit - 1);
    let (first_col, last_col) = (clamp(x, layout.width) / span, clamp((x + w).ceil() - 1.0, layout.width) / span);
    let (first_row, last_row) =
        (clamp(y, layout.height) / layout.mcu_height, clamp((y + h).ceil() - 1.0, layout.height) / layout.mcu_height);
    if first_col == 0 && last_col + 1 == per_row && first_row == 0 && last_row + 1 == rows {
        return None; // the whole image: nothing to cut
    }
    let needed = ((last_row + 1) * per_row) as usize;
    let found = intervals(jpeg, layout.data, needed)?;
    let (left, top) = (first_col * span, first_row * layout.mcu_height);
    let width = ((last_col + 1) * span).min(layout.width) - left;
    let height = ((last_row + 1) * layout.mcu_height).min(layout.height) - top;

    let (sof_start, sof_end) = layout.sof;
    let mut out = Vec::with_capacity(jpeg.len() / 2);
    out.extend_from_slice(&jpeg[..sof_start]);
    let mut sof = jpeg[sof_start..sof_end].to_vec();
    sof[5..7].copy_from_slice(&(height as u16).to_be_bytes());
    sof[7..9].copy_from_slice(&(width as u16).to_be_bytes());
    out.extend_from_slice(&sof);
    out.extend_from_slice(&jpeg[sof_end..layout.data]);
    let mut written = 0usize;
    for row in first_row..=last_row {
        for col in first_col..=last_col {
            if written > 0 {
                out.extend_from_slice(&[0xFF, 0xD0 + (written - 1) as u8 % 8]);
            }
            let (start, end) = found[(row * per_row + col) as usize];
            out.extend_from_slice(&jpeg[start..end]);
            written += 1;
        }
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    Some(SubImage { jpeg: out, left, top })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::jpeg;
    use crate::image::tests::gradient;
    use crate::synthetic;

    /// A photograph-like JPEG of `width`×`height`, with restart markers (as `datasets pack` writes it).
    fn marked(width: u32, height: u32, subsampled: bool) -> (Vec<u8>, Vec<u8>) {
        let pixels = synthetic::picture(3, 10, width, height, 7);
        let plain = if subsampled {
            synthetic::jpeg_420(&pixels, width, height, 90).unwrap()
        } else {
            synthetic::jpeg(&pixels, width, height, 90).unwrap()
        };
        let rewritten = jpeg::with_restarts(&plain).unwrap().expect("a baseline JPEG is rewritten");
        (plain, rewritten)
    }

    #[test]
    fn rewriting_with_restart_markers_keeps_every_pixel() {
        for subsampled in [false, true] {
            let (plain, rewritten) = marked(413, 357, subsampled);
            let whole = |bytes: &[u8]| jpeg::region(bytes, 0.0, 0.0, 413.0, 357.0, 413).unwrap().pixels;
            assert!(whole(&plain) == whole(&rewritten), "subsampled {subsampled}: the same pixels");
            assert!(layout(&rewritten).is_some(), "cuttable");
            assert!(layout(&plain).is_none(), "no markers: not cuttable");
        }
    }

    #[test]
    fn a_crop_of_its_intervals_decodes_to_the_crop_of_the_whole() {
        for subsampled in [false, true] {
            let (_, rewritten) = marked(413, 357, subsampled);
            // (the last at 2/8 scale: 250 × 2/8 ≥ 60)
            let crops =
                [(0.0, 0.0, 100.0, 80.0, 224), (201.5, 190.0, 211.5, 167.0, 224), (37.0, 55.0, 250.0, 240.0, 60)];
            for (x, y, w, h, out) in crops {
                let sub = sub_image(&rewritten, x, y, w, h).expect("cut");
                assert!(sub.jpeg.len() < rewritten.len());
                let cut = jpeg::region(&sub.jpeg, x - f64::from(sub.left), y - f64::from(sub.top), w, h, out).unwrap();
                let full = jpeg::region(&rewritten, x, y, w, h, out).unwrap();
                assert_eq!((cut.width, cut.height, cut.scale), (full.width, full.height, full.scale));
                assert_eq!(
                    (cut.left + sub.left * cut.scale / 8, cut.top + sub.top * cut.scale / 8),
                    (full.left, full.top),
                    "the same place in the image"
                );
                let differing = cut.pixels.iter().zip(&full.pixels).filter(|(a, b)| a.abs_diff(**b) > 2).count();
                // 4:4:4 has no upsampling across the cut: exact; 4:2:0 smooths its chroma over one pixel
                // more at the cut's edges, which libjpeg replicates rather than reads
                let allowed = if subsampled { cut.pixels.len() / 20 } else { 0 };
                assert!(differing <= allowed, "subsampled {subsampled}, {x},{y} {w}x{h}: {differing} bytes differ");
            }
        }
    }

    #[test]
    fn what_cannot_be_cut_is_left_to_the_whole_path() {
        let (_, rewritten) = marked(200, 160, false);
        assert!(sub_image(&rewritten, 0.0, 0.0, 200.0, 160.0).is_none(), "the whole image");
        let truncated = &rewritten[..rewritten.len() / 2];
        assert!(sub_image(truncated, 150.0, 120.0, 40.0, 30.0).is_none(), "its data ends before the crop");
        let mut renumbered = rewritten.clone();
        let first = (layout(&rewritten).unwrap().data..renumbered.len() - 1)
            .find(|&i| renumbered[i] == 0xFF && renumbered[i + 1] == 0xD0)
            .unwrap();
        renumbered[first + 1] = 0xD3;
        assert!(sub_image(&renumbered, 150.0, 120.0, 40.0, 30.0).is_none(), "a marker out of sequence");
        let png_like = gradient(8, 8).pixels;
        assert!(sub_image(&png_like, 0.0, 0.0, 4.0, 4.0).is_none());
        for cut in 0..rewritten.len().min(700) {
            let _ = sub_image(&rewritten[..cut], 10.0, 10.0, 50.0, 50.0); // never panics
        }
    }
}
