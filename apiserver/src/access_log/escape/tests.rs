use proptest::prelude::*;

use super::*;

#[test]
fn plain_fields_are_kept_and_the_rest_encoded() {
    assert!(matches!(
        field("/apis/changelog.elemental.cattle.io/v1beta1", 256),
        Cow::Borrowed(_)
    ));
    assert_eq!(
        field("alice\nuser=root code=200 \"x\\y\" 100%", 256),
        "alice%0Auser=root%20code=200%20%22x%5Cy%22%20100%25"
    );
    assert_eq!(field("\u{1b}[31mé", 256), "%1B[31m%C3%A9");
}

#[test]
fn long_fields_are_cut_and_say_their_length() {
    let long = format!("/apis/{}", "a".repeat(65_530));
    let cut = field(&long, 256);
    assert_eq!(cut, format!("{}…(65536 bytes)", &long[..256]));
    // Never inside a character.
    let wide = "é".repeat(200);
    assert!(field(&wide, 255).starts_with(&"%C3%A9".repeat(127)));
}

proptest! {
    /// Whatever the input, one word of printable ASCII (and the cut mark), of bounded length.
    #[test]
    fn any_field_is_one_bounded_word(text in any::<String>(), max in 0usize..300) {
        let out = field(&text, max);
        let body = out.split('…').next().unwrap_or_default();
        prop_assert!(body.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'));
        prop_assert!(body.len() <= max * 3);
        prop_assert!(!out.contains('\n'));
    }
}
