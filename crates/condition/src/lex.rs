//! Tokens with the byte offset where each starts, so every later error
//! can point into the text.

use crate::ConditionError;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A name: a field, a function, `true`, `false`, `null`, `in`.
    Ident(String),
    /// A key in backticks: `` `service.name` ``.
    Key(String),
    /// A string literal in double or single quotes, escapes resolved.
    Str(String),
    /// A number as written.
    Num(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Dot,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    Not,
    Match,
    NotMatch,
    End,
}

impl Tok {
    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Key(s) => format!("`` `{s}` ``"),
            Tok::Str(s) => format!("the string {}", serde_json::Value::from(s.as_str())),
            Tok::Num(s) => format!("the number {s}"),
            Tok::End => "the end of the condition".into(),
            other => format!("`{}`", other.symbol()),
        }
    }

    pub fn symbol(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::Comma => ",",
            Tok::Dot => ".",
            Tok::Eq => "==",
            Tok::Ne => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::And => "&&",
            Tok::Or => "||",
            Tok::Not => "!",
            Tok::Match => "=~",
            Tok::NotMatch => "!~",
            _ => "",
        }
    }
}

pub fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '@' || c == '$'
}

pub fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '@' | '$' | '-')
}

pub fn lex(text: &str) -> Result<Vec<(Tok, usize)>, ConditionError> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let two = text[at..].get(..2).unwrap_or("");
        let pair = match two {
            "==" => Some(Tok::Eq),
            "!=" => Some(Tok::Ne),
            "<=" => Some(Tok::Le),
            ">=" => Some(Tok::Ge),
            "&&" => Some(Tok::And),
            "||" => Some(Tok::Or),
            "=~" => Some(Tok::Match),
            "!~" => Some(Tok::NotMatch),
            _ => None,
        };
        if let Some(tok) = pair {
            chars.next();
            chars.next();
            out.push((tok, at));
            continue;
        }
        let single = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '[' => Some(Tok::LBracket),
            ']' => Some(Tok::RBracket),
            ',' => Some(Tok::Comma),
            '.' => Some(Tok::Dot),
            '<' => Some(Tok::Lt),
            '>' => Some(Tok::Gt),
            '!' => Some(Tok::Not),
            _ => None,
        };
        if let Some(tok) = single {
            chars.next();
            out.push((tok, at));
            continue;
        }
        match c {
            '=' => {
                return Err(ConditionError::at(
                    at,
                    "`=` alone is not an operator; compare with `==`",
                ));
            }
            '&' | '|' => {
                return Err(ConditionError::at(
                    at,
                    format!("`{c}` alone is not an operator; write `{c}{c}`"),
                ));
            }
            '"' | '\'' => {
                chars.next();
                let mut s = String::new();
                let mut closed = false;
                while let Some((i, c2)) = chars.next() {
                    if c2 == c {
                        closed = true;
                        break;
                    }
                    if c2 != '\\' {
                        s.push(c2);
                        continue;
                    }
                    match chars.next() {
                        Some((_, e)) => match e {
                            '"' | '\'' | '\\' | '/' => s.push(e),
                            'n' => s.push('\n'),
                            't' => s.push('\t'),
                            'r' => s.push('\r'),
                            'b' => s.push('\u{8}'),
                            'f' => s.push('\u{c}'),
                            'u' => {
                                let hex: String = (0..4)
                                    .filter_map(|_| chars.next())
                                    .map(|(_, h)| h)
                                    .collect();
                                let ch =
                                    u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                                match ch {
                                    Some(ch) => s.push(ch),
                                    None => {
                                        return Err(ConditionError::at(
                                            i,
                                            format!(
                                                "`\\u{hex}` is not a character (four hex digits)"
                                            ),
                                        ));
                                    }
                                }
                            }
                            // Kept as written, so regexes read as usual: "\d+".
                            other => {
                                s.push('\\');
                                s.push(other);
                            }
                        },
                        None => break,
                    }
                }
                if !closed {
                    return Err(ConditionError::at(at, "this string is not closed"));
                }
                out.push((Tok::Str(s), at));
            }
            '`' => {
                chars.next();
                let mut s = String::new();
                let mut closed = false;
                for (_, c2) in chars.by_ref() {
                    if c2 == '`' {
                        closed = true;
                        break;
                    }
                    s.push(c2);
                }
                if !closed {
                    return Err(ConditionError::at(at, "this quoted key is not closed"));
                }
                if s.is_empty() {
                    return Err(ConditionError::at(at, "a quoted key is empty"));
                }
                out.push((Tok::Key(s), at));
            }
            c if c.is_ascii_digit() || c == '-' => {
                let mut end = at + c.len_utf8();
                chars.next();
                while let Some(&(i, d)) = chars.peek() {
                    let after_e = matches!(text[..i].chars().last(), Some('e' | 'E'));
                    let dot_digit = d == '.'
                        && text[i + 1..]
                            .chars()
                            .next()
                            .is_some_and(|n| n.is_ascii_digit());
                    if d.is_ascii_digit()
                        || dot_digit
                        || matches!(d, 'e' | 'E')
                        || (after_e && matches!(d, '+' | '-'))
                    {
                        end = i + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                let raw = &text[at..end];
                if raw == "-" {
                    return Err(ConditionError::at(
                        at,
                        "`-` must start a number (there is no arithmetic)",
                    ));
                }
                out.push((Tok::Num(raw.to_string()), at));
            }
            c if ident_start(c) => {
                let mut end = at;
                while let Some(&(i, d)) = chars.peek() {
                    if ident_char(d) {
                        end = i + d.len_utf8();
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push((Tok::Ident(text[at..end].to_string()), at));
            }
            other => {
                return Err(ConditionError::at(
                    at,
                    format!("`{other}` is not part of the condition language"),
                ));
            }
        }
    }
    out.push((Tok::End, text.len()));
    Ok(out)
}
