// Syntax tree of a parsed template (internal to text/jinja).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace lmserve::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // args
    kTuple,      // args
    kDict,       // kwargs-like pairs in `pairs`
    kGetAttr,    // args[0].name
    kGetItem,    // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..])
    kNeg,        // -args[0]
    kPos,        // +args[0]
    kNot,        // not args[0]
    kBinary,     // args[0] op args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,
    kOr,
    kCondExpr,   // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0, col = 0;
  Value value;
  std::string name;  // name / attribute / filter / test / operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;  // dict literal
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kFilterBlock, kPassthrough };
  Kind kind;
  int line = 0, col = 0;
  std::string text;                                // kText
  ExprPtr expr;                                    // kOutput value; kFor iterable; kSet value; kFilterBlock filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (condition, body)...
  Body body;                                       // kFor, kSetBlock, kMacro, kFilterBlock, kPassthrough; kIf: else
  Body else_body;                                  // kFor
  std::vector<std::string> targets;                // kFor / kSet names; kSet on a namespace: {ns, attr}
  bool namespace_target = false;                   // kSet: {% set ns.attr = ... %}
  ExprPtr condition;                               // kFor: `if` filter
  std::string name;                                // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
};

}  // namespace lmserve::text::jinja
