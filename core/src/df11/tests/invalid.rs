use super::super::{
    exponent_histogram, Codebook, Df11Error, Df11Field, Df11Group, Df11GroupBuf, BLOCK_BYTES, MAX_GROUP_LEN,
};
use super::round_trip::fibonacci_counts;
use super::{decode, kernel_model, Rng};

/// A valid group of three blocks and two linears, to break one field at a time.
fn valid() -> Df11GroupBuf {
    let mut rng = Rng::new(11);
    let exponents: Vec<u8> = (0..15_000).map(|_| 100 + rng.below(30) as u8).collect();
    let w = rng.words_with_exponents(&exponents);
    let buf = Df11GroupBuf::encode(&[&w[..4000], &w[4000..]]).expect("encodes");
    assert_eq!(buf.group().expect("valid").n_blocks(), 3);
    buf
}

fn check(buf: &Df11GroupBuf) -> Result<Df11Group<'_>, Df11Error> {
    buf.group()
}

#[test]
fn truncating_any_field_is_an_error() {
    let base = valid();
    for field in Df11Field::ALL {
        let mut buf = base.clone();
        let v = match field {
            Df11Field::Luts => &mut buf.luts,
            Df11Field::EncodedExponent => &mut buf.encoded_exponent,
            Df11Field::SignMantissa => &mut buf.sign_mantissa,
            Df11Field::OutputPositions => &mut buf.output_positions,
            Df11Field::Gaps => &mut buf.gaps,
            Df11Field::SplitPositions => &mut buf.split_positions,
        };
        if field == Df11Field::EncodedExponent {
            // A shorter bitstream is only visible when it loses a whole block.
            v.truncate(2 * BLOCK_BYTES);
        } else {
            v.pop();
        }
        let err = check(&buf).expect_err(field.name());
        let message = err.to_string();
        assert!(message.contains(field.name()), "{field}: {message}");
    }
}

#[test]
fn code_bytes_in_a_new_block_need_positions_and_gaps() {
    let mut buf = valid();
    let n_bytes = buf.encoded_exponent.len();
    buf.encoded_exponent.resize(BLOCK_BYTES * n_bytes.div_ceil(BLOCK_BYTES) + 1, 0);
    assert!(matches!(check(&buf), Err(Df11Error::GapsLength { .. })), "{:?}", check(&buf));
    buf.gaps.resize(buf.gaps.len() + 320, 0);
    assert!(check(&buf).is_ok(), "positions may stop one short (spec §2.7)");
    buf.encoded_exponent.resize(buf.encoded_exponent.len() + BLOCK_BYTES, 0);
    buf.gaps.resize(buf.gaps.len() + 320, 0);
    assert!(matches!(check(&buf), Err(Df11Error::PositionsLength { .. })));
}

#[test]
fn lut_shape() {
    let mut buf = valid();
    buf.luts.truncate(256);
    assert_eq!(check(&buf).err(), Some(Df11Error::LutShape { len: 256 }));
    buf.luts = vec![0; 256 * 19];
    assert_eq!(check(&buf).err(), Some(Df11Error::LutShape { len: 256 * 19 }));
}

#[test]
fn pointers_must_name_an_existing_sub_table() {
    let mut buf = valid();
    let tables = buf.luts.len() / 256 - 1;
    buf.luts[7] = (256 - tables) as u8; // one past the last table
    let err = check(&buf).expect_err("dangling pointer");
    assert_eq!(err, Df11Error::BadPointer { table: 0, key: 7, value: (256 - tables) as u8, tables });
    assert!(err.to_string().contains("luts"), "{err}");
}

#[test]
fn decoded_exponents_need_a_length_of_1_to_32() {
    let mut buf = valid();
    let lengths = buf.luts.len() - 256;
    let exponent = buf.luts[0];
    buf.luts[lengths + usize::from(exponent)] = 0;
    assert_eq!(check(&buf).err(), Some(Df11Error::CodeLength { exponent, length: 0 }));
    buf.luts[lengths + usize::from(exponent)] = 33;
    assert_eq!(check(&buf).err(), Some(Df11Error::CodeLength { exponent, length: 33 }));
}

#[test]
fn pointer_values_have_no_length() {
    let mut buf = valid();
    let lengths = buf.luts.len() - 256;
    buf.luts[lengths + 250] = 3;
    assert_eq!(check(&buf).err(), Some(Df11Error::PointerLength { value: 250, length: 3 }));
}

fn set_position(buf: &mut Df11GroupBuf, i: usize, value: u32) {
    buf.output_positions[4 * i..4 * i + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn output_positions_must_rise_from_0_to_n() {
    let base = valid();
    let n = base.sign_mantissa.len();

    let mut buf = base.clone();
    set_position(&mut buf, 0, 1);
    assert_eq!(check(&buf).err(), Some(Df11Error::FirstPosition { value: 1 }));

    let mut buf = base.clone();
    set_position(&mut buf, 2, 10);
    assert!(matches!(check(&buf), Err(Df11Error::PositionsDecrease { index: 2, value: 10, .. })));

    let mut buf = base.clone();
    set_position(&mut buf, 3, n as u32 + 1);
    assert_eq!(check(&buf).err(), Some(Df11Error::LastPosition { value: n + 1, n_elements: n }));

    let mut buf = base.clone();
    set_position(&mut buf, 1, u32::MAX);
    assert!(matches!(check(&buf), Err(Df11Error::PositionsDecrease { index: 2, .. })));

    let mut buf = base;
    buf.output_positions.extend_from_slice(&(n as u32).to_le_bytes());
    assert_eq!(check(&buf).err(), Some(Df11Error::PositionsLength { len: 20, n_blocks: 3 }));
}

#[test]
fn split_positions_must_stay_within_the_group() {
    let base = valid();
    let n = base.sign_mantissa.len();
    for (bad, ok) in [(-1i64, false), (n as i64 + 1, false), (0, true), (n as i64, true)] {
        let mut buf = base.clone();
        buf.split_positions = bad.to_le_bytes().to_vec();
        assert_eq!(check(&buf).is_ok(), ok, "{bad}");
    }
    let mut buf = base;
    buf.split_positions = [20i64, 10].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(check(&buf).err(), Some(Df11Error::SplitPosition { index: 1, value: 10, n_elements: n }));
}

#[test]
fn outputs_must_fit_the_group_or_block() {
    let buf = valid();
    let group = buf.group().expect("valid");
    let n = group.n_elements();
    let mut out = vec![0; n + 1];
    assert_eq!(group.decode_into(&mut out).err(), Some(Df11Error::OutputLength { len: n + 1, expected: n }));
    let len = group.block_output_range(1).expect("block 1").len();
    assert_eq!(
        group.decode_block_into(1, &mut out[..len - 1]).err(),
        Some(Df11Error::OutputLength { len: len - 1, expected: len })
    );
    assert_eq!(group.decode_block_into(3, &mut []).err(), Some(Df11Error::BlockIndex { block: 3, n_blocks: 3 }));
}

#[test]
fn a_pointer_loop_ends() {
    // Root entries that point to table 1, whose entries point to itself: four lookups end on
    // a pointer. The official kernel would spin (length 0); ours drops the thread's rest.
    let mut buf = valid();
    let lengths = buf.luts.split_off(buf.luts.len() - 256);
    buf.luts = [vec![255; 512], lengths].concat();
    let group = buf.group().expect("structurally valid");
    let out = decode(&group);
    assert!(out.iter().all(|&w| w == 0), "nothing decodes, the words are zeroed");
    assert_eq!(kernel_model::decode(&buf.fields()), out);
}

#[test]
fn encoder_errors() {
    let nan = 0x7fc0u16;
    assert_eq!(
        Df11GroupBuf::encode(&[&[0x3f80, 0x3f80], &[nan]]).err(),
        Some(Df11Error::UnencodableExponent { exponent: 255, element: Some(2) })
    );
    let big = crate::numerics::bf16::from_f32(2f32.powi(113));
    assert_eq!(exponent_histogram(&[&[big]]).err(), Some(Df11Error::UnencodableExponent { exponent: 240, element: Some(0) }));
    let mut counts = [0u64; 256];
    assert_eq!(Codebook::from_counts(&counts).err(), Some(Df11Error::Empty));
    assert_eq!(Df11GroupBuf::encode(&[]).err(), Some(Df11Error::Empty));
    counts[241] = 1;
    assert_eq!(Codebook::from_counts(&counts).err(), Some(Df11Error::UnencodableExponent { exponent: 241, element: None }));

    let codebook = Codebook::from_counts(&fibonacci_counts()).expect("codebook");
    let words = [super::super::bf16_from_parts(100, 0), super::super::bf16_from_parts(50, 0)];
    let err = Df11GroupBuf::encode_with(&codebook, &[&words]).expect_err("exponent 50 has no code");
    assert_eq!(err, Df11Error::NotInCodebook { exponent: 50, element: 1 });

    // 2^31 elements without allocating them: the same slice many times.
    let chunk = vec![0u16; 1 << 20];
    let slices = vec![&chunk[..]; MAX_GROUP_LEN >> 20];
    let err = exponent_histogram(&slices).expect_err("too large");
    assert_eq!(err, Df11Error::TooLarge { field: Df11Field::SignMantissa, len: MAX_GROUP_LEN });
    assert!(matches!(Df11GroupBuf::encode_with(&codebook, &slices), Err(Df11Error::TooLarge { .. })));
}

#[test]
fn more_than_16_sub_tables_is_an_error() {
    // A wide bell over all 240 exponents: many codes of 9-16 bits under different first
    // bytes. The official encoder writes pointer values 239, 238, ... here, which read back
    // as exponents.
    let mut counts = [0u64; 256];
    for (e, c) in counts.iter_mut().enumerate().take(240) {
        let x = (e as f64 - 120.0) / 32.0;
        *c = 1 + (1e9 * libm::exp(-x * x / 2.0)) as u64;
    }
    let err = Codebook::from_counts(&counts).expect_err("too many tables");
    assert!(matches!(err, Df11Error::TooManyTables { tables } if tables > 16), "{err:?}");
    assert!(err.to_string().contains("16"), "{err}");
}
