//! Exchanges: work handed back and forth between two agents on one topic.
//!
//! The `messages` channel is the record: each message names its `author` and, in the field
//! the router's configuration names (`topic` by default), its topic. Walking back from the
//! latest message, the trailing exchange is the longest run of messages on the latest topic
//! written by the latest author and one other agent; its count is the number of hand-overs
//! between the two. `dev, tea, dev, tea, dev` on one topic is 4 exchanges. A message by a
//! third author (a human's answer, another agent) or on another topic ends the run, and
//! consecutive messages by the same author are one turn.

use serde::Serialize;
use serde_json::Value;

/// The trailing exchange of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exchange {
    /// The two agents, in name order.
    pub(crate) pair: (String, String),
    /// The topic (`null` when the messages name none).
    pub(crate) topic: Value,
    /// Hand-overs between the two.
    pub(crate) count: u32,
}

fn author(message: &Value) -> Option<&str> {
    message.get("author").and_then(Value::as_str)
}

fn topic<'m>(message: &'m Value, field: &str) -> &'m Value {
    message.get(field).unwrap_or(&Value::Null)
}

/// The trailing exchange of `messages` (none without two authors at its end).
pub(crate) fn trailing_exchange(messages: &[Value], topic_field: &str) -> Option<Exchange> {
    let (last, earlier) = messages.split_last()?;
    let latest = author(last)?;
    let latest_topic = topic(last, topic_field);
    let mut other: Option<&str> = None;
    let mut previous = latest;
    let mut count = 0;
    for message in earlier.iter().rev() {
        let Some(name) = author(message) else { break };
        if topic(message, topic_field) != latest_topic {
            break;
        }
        if name == previous {
            continue;
        }
        match other {
            None => other = Some(name),
            Some(other) if name != latest && name != other => break,
            Some(_) => {}
        }
        count += 1;
        previous = name;
    }
    let other = other?;
    let pair = if latest <= other {
        (latest.to_owned(), other.to_owned())
    } else {
        (other.to_owned(), latest.to_owned())
    };
    Some(Exchange {
        pair,
        topic: latest_topic.clone(),
        count,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(authors: &[(&str, &str)]) -> Vec<Value> {
        authors
            .iter()
            .map(|(author, topic)| json!({"author": author, "topic": topic, "content": "..."}))
            .collect()
    }

    fn count(authors: &[(&str, &str)]) -> Option<u32> {
        trailing_exchange(&messages(authors), "topic").map(|e| e.count)
    }

    #[test]
    fn hand_overs_between_the_last_two_authors_on_one_topic_count() {
        let x = "story-1";
        assert_eq!(
            count(&[("dev", x), ("tea", x), ("dev", x), ("tea", x)]),
            Some(3)
        );
        let four = [("dev", x), ("tea", x), ("dev", x), ("tea", x), ("dev", x)];
        let exchange = trailing_exchange(&messages(&four), "topic").unwrap();
        assert_eq!(exchange.count, 4);
        assert_eq!(exchange.pair, ("dev".to_owned(), "tea".to_owned()));
        assert_eq!(exchange.topic, json!("story-1"));
        // Two messages in a row by one author are one turn.
        assert_eq!(
            count(&[("dev", x), ("dev", x), ("tea", x), ("tea", x)]),
            Some(1)
        );
    }

    #[test]
    fn a_third_author_or_another_topic_ends_the_exchange() {
        let x = "story-1";
        let y = "story-2";
        assert_eq!(
            count(&[("dev", x), ("tea", x), ("human", x), ("dev", x), ("tea", x)]),
            Some(1)
        );
        assert_eq!(
            count(&[("dev", x), ("tea", x), ("dev", x), ("tea", y), ("dev", y)]),
            Some(1)
        );
        assert_eq!(count(&[("pm", x), ("dev", x), ("tea", x)]), Some(1));
        assert_eq!(count(&[("dev", x)]), None);
        assert_eq!(count(&[]), None);
        // Messages that name no topic share the `null` topic.
        let untopical = vec![json!({"author": "a"}), json!({"author": "b"})];
        assert_eq!(
            trailing_exchange(&untopical, "topic").map(|e| e.count),
            Some(1)
        );
    }
}
