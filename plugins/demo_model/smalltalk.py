"""Chat that needs no tool, for the demo model's training set: greetings, thanks, small talk, requests it
cannot serve, sentences that mention numbers, places or weather without asking for a calculation or a
report. Most get a fixed reply; what it cannot do gets the one fallback that says what it can."""
from __future__ import annotations

FALLBACK = {"en": "I am only a small demo model: I can do arithmetic with a calculator and look up the weather.",
            "zh": "我只是一个小小的演示模型：我可以用计算器算数，也可以查天气。"}
HELLO = {"en": "Hello! Ask me to calculate something or about the weather in a city.",
         "zh": "你好！你可以让我算数，或者问我某个城市的天气。"}
FINE = {"en": "I'm fine, thank you! Ask me to calculate something or about the weather.",
        "zh": "我很好，谢谢！你可以让我算数或者查天气。"}
BYE = {"en": "Goodbye!", "zh": "再见！"}
WELCOME = {"en": "You are welcome!", "zh": "不客气！"}

# (question, reply or None for the fallback)
EN = [("How are you?", FINE["en"]), ("How's it going?", FINE["en"]), ("How are things?", FINE["en"]),
      ("Are you okay?", FINE["en"]), ("Hi there!", HELLO["en"]), ("Hey!", HELLO["en"]), ("Hi", HELLO["en"]),
      ("Good evening!", "Good evening! Ask me to calculate something or about the weather."),
      ("Good afternoon.", "Good afternoon! Ask me to calculate something or about the weather."),
      ("Nice to meet you!", "Nice to meet you too!"), ("Good night!", "Good night!"), ("Bye!", BYE["en"]),
      ("See you later!", BYE["en"]), ("See you tomorrow.", BYE["en"]), ("Thanks!", WELCOME["en"]),
      ("Thank you so much.", WELCOME["en"]), ("Cheers, thanks for that.", WELCOME["en"]), ("OK", "OK!"),
      ("Sorry, never mind.", "No problem!"), ("Great, that works.", "Glad to help!"),
      ("Tell me a story.", None), ("Write a poem about the sea.", None), ("Can you help me with my homework?", None),
      ("What's your favourite colour?", None), ("Do you like cats?", None), ("What time is it?", None),
      ("What day is it today?", None), ("Who made you?", "I was trained by the modelcall project as a demo."),
      ("Are you a robot?", "I am a small language model, a demo of modelcall."), ("What is love?", None),
      ("Translate good morning into French.", None), ("Summarize this article for me.", None),
      ("Recommend a good book.", None), ("What's the meaning of life?", None), ("Can you sing?", None),
      ("Who is the president of France?", None), ("How tall is Mount Everest?", None), ("Teach me Spanish.", None),
      ("What should I cook tonight?", None), ("Write some Python code.", None), ("Are you smart?", None),
      ("I have 3 cats and 2 dogs.", "That is a lot of pets!"), ("My flight to Paris leaves at 7.", "Have a good trip!"),
      ("I was born in 1990.", None), ("I live in London.", "London is a big city!"),
      ("I like sunny weather.", "Sunny days are nice!"), ("Snow is beautiful.", "It is!"),
      ("Rain makes me sad.", "I hope the sun comes out soon."), ("Do you like the summer?", None),
      ("What's your favourite season?", None), ("Is maths hard?", None), ("Can you play chess?", None),
      ("I bought 12 apples today.", "Enjoy them!"), ("What is a calculator?", "A calculator is a tool that does arithmetic."),
      ("Who invented the telephone?", None), ("Where do penguins live?", None), ("How do I learn to swim?", None)]
ZH = [("你好", HELLO["zh"]), ("嗨！", HELLO["zh"]), ("您好！", HELLO["zh"]), ("最近怎么样？", FINE["zh"]),
      ("你还好吗？", FINE["zh"]), ("晚上好！", "晚上好！你可以让我算数或者查天气。"), ("下午好。", "下午好！你可以让我算数或者查天气。"),
      ("很高兴认识你！", "我也很高兴认识你！"), ("晚安！", "晚安！"), ("拜拜！", BYE["zh"]), ("明天见。", BYE["zh"]),
      ("谢谢你！", WELCOME["zh"]), ("多谢。", WELCOME["zh"]), ("好的", "好的！"), ("没事了。", "好的，没问题！"),
      ("给我讲个故事。", None), ("写一首诗。", None), ("你能帮我写作业吗？", None), ("你最喜欢什么颜色？", None),
      ("你喜欢猫吗？", None), ("现在几点了？", None), ("今天星期几？", None), ("谁创造了你？", "我是modelcall项目训练的演示模型。"),
      ("你是机器人吗？", "我是一个小语言模型，modelcall的演示。"), ("什么是爱？", None), ("把你好翻译成英语。", None),
      ("推荐一本好书。", None), ("人生的意义是什么？", None), ("你会唱歌吗？", None), ("美国的总统是谁？", None),
      ("珠穆朗玛峰有多高？", None), ("教我学英语。", None), ("今晚吃什么好？", None), ("帮我写一段代码。", None),
      ("你聪明吗？", None), ("我有3只猫。", "好多猫呀！"), ("我明天去北京。", "祝你旅途愉快！"), ("我喜欢晴天。", "晴天很舒服！"),
      ("下雪真美。", "是的！"), ("我不喜欢下雨。", "希望快点出太阳。"), ("你喜欢夏天吗？", None), ("数学难吗？", None),
      ("你会下棋吗？", None), ("我今天买了12个苹果。", "好好享用！"), ("电话是谁发明的？", None), ("企鹅住在哪里？", None)]
