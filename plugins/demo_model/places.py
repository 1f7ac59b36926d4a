"""The cities of the demo model's training set: real ones (English and Chinese names) and made-up ones spelled
from syllables and from the characters Chinese uses for place names, so the model learns to copy a city's
name piece by piece into its call rather than to recognise a fixed list (a city outside every list still
works). No city of the hand-written evaluation split (eval_questions.jsonl) is among them."""
from __future__ import annotations

import random

# (English, Chinese); the first 48 are the corpus's original list (tests ask for some of them)
REAL_CITIES = [
    ("Paris", "巴黎"), ("London", "伦敦"), ("Tokyo", "东京"), ("Beijing", "北京"), ("Shanghai", "上海"),
    ("Berlin", "柏林"), ("Rome", "罗马"), ("Madrid", "马德里"), ("Moscow", "莫斯科"), ("Cairo", "开罗"),
    ("Sydney", "悉尼"), ("Toronto", "多伦多"), ("Seoul", "首尔"), ("Singapore", "新加坡"),
    ("Bangkok", "曼谷"), ("Dubai", "迪拜"), ("Istanbul", "伊斯坦布尔"), ("Vienna", "维也纳"),
    ("Prague", "布拉格"), ("Lisbon", "里斯本"), ("Athens", "雅典"), ("Dublin", "都柏林"),
    ("Oslo", "奥斯陆"), ("Stockholm", "斯德哥尔摩"), ("Helsinki", "赫尔辛基"), ("Warsaw", "华沙"),
    ("Amsterdam", "阿姆斯特丹"), ("Brussels", "布鲁塞尔"), ("Zurich", "苏黎世"), ("Chicago", "芝加哥"),
    ("Boston", "波士顿"), ("Seattle", "西雅图"), ("Miami", "迈阿密"), ("Mumbai", "孟买"),
    ("Delhi", "德里"), ("Nairobi", "内罗毕"), ("Lima", "利马"), ("Mexico City", "墨西哥城"),
    ("New York", "纽约"), ("San Francisco", "旧金山"), ("Hong Kong", "香港"), ("Shenzhen", "深圳"),
    ("Guangzhou", "广州"), ("Chengdu", "成都"), ("Hangzhou", "杭州"), ("Osaka", "大阪"),
    ("Vancouver", "温哥华"), ("Melbourne", "墨尔本"),
    ("Los Angeles", "洛杉矶"), ("Washington", "华盛顿"), ("Philadelphia", "费城"), ("Houston", "休斯顿"),
    ("Dallas", "达拉斯"), ("Atlanta", "亚特兰大"), ("Las Vegas", "拉斯维加斯"), ("Detroit", "底特律"),
    ("Ottawa", "渥太华"), ("Calgary", "卡尔加里"), ("Buenos Aires", "布宜诺斯艾利斯"), ("Rio de Janeiro", "里约热内卢"),
    ("Sao Paulo", "圣保罗"), ("Caracas", "加拉加斯"), ("Quito", "基多"), ("Manchester", "曼彻斯特"),
    ("Liverpool", "利物浦"), ("Glasgow", "格拉斯哥"), ("Munich", "慕尼黑"), ("Hamburg", "汉堡"),
    ("Frankfurt", "法兰克福"), ("Cologne", "科隆"), ("Milan", "米兰"), ("Venice", "威尼斯"),
    ("Florence", "佛罗伦萨"), ("Naples", "那不勒斯"), ("Lyon", "里昂"), ("Marseille", "马赛"),
    ("Bern", "伯尔尼"), ("Bucharest", "布加勒斯特"), ("Sofia", "索非亚"), ("Belgrade", "贝尔格莱德"),
    ("Zagreb", "萨格勒布"), ("Kyiv", "基辅"), ("Minsk", "明斯克"), ("Riga", "里加"), ("Vilnius", "维尔纽斯"),
    ("St Petersburg", "圣彼得堡"), ("Ankara", "安卡拉"), ("Tehran", "德黑兰"), ("Baghdad", "巴格达"),
    ("Riyadh", "利雅得"), ("Doha", "多哈"), ("Abu Dhabi", "阿布扎比"), ("Karachi", "卡拉奇"), ("Lahore", "拉合尔"),
    ("Dhaka", "达卡"), ("Colombo", "科伦坡"), ("Kolkata", "加尔各答"), ("Chennai", "金奈"),
    ("Bangalore", "班加罗尔"), ("Jakarta", "雅加达"), ("Manila", "马尼拉"), ("Kuala Lumpur", "吉隆坡"),
    ("Phnom Penh", "金边"), ("Yangon", "仰光"), ("Taipei", "台北"), ("Macau", "澳门"), ("Busan", "釜山"),
    ("Ulaanbaatar", "乌兰巴托"), ("Almaty", "阿拉木图"), ("Tashkent", "塔什干"), ("Nagoya", "名古屋"),
    ("Sapporo", "札幌"), ("Fukuoka", "福冈"), ("Perth", "珀斯"), ("Brisbane", "布里斯班"), ("Adelaide", "阿德莱德"),
    ("Wellington", "惠灵顿"), ("Cape Town", "开普敦"), ("Johannesburg", "约翰内斯堡"), ("Casablanca", "卡萨布兰卡"),
    ("Tunis", "突尼斯"), ("Algiers", "阿尔及尔"), ("Accra", "阿克拉"), ("Dakar", "达喀尔"), ("Khartoum", "喀土穆"),
    ("Kinshasa", "金沙萨"), ("Tianjin", "天津"), ("Chongqing", "重庆"), ("Suzhou", "苏州"), ("Harbin", "哈尔滨"),
    ("Shenyang", "沈阳"), ("Dalian", "大连"), ("Jinan", "济南"), ("Zhengzhou", "郑州"), ("Changsha", "长沙"),
    ("Nanchang", "南昌"), ("Fuzhou", "福州"), ("Hefei", "合肥"), ("Lanzhou", "兰州"), ("Lhasa", "拉萨"),
    ("Guilin", "桂林"), ("Sanya", "三亚"), ("Ningbo", "宁波"), ("Wuxi", "无锡"), ("Taiyuan", "太原"),
    ("Nanning", "南宁"), ("Guiyang", "贵阳"), ("Haikou", "海口"), ("Changchun", "长春"), ("Zhuhai", "珠海"),
    ("Foshan", "佛山"), ("Luoyang", "洛阳"), ("Yangzhou", "扬州"), ("Lijiang", "丽江"), ("Porto", "波尔图"),
    ("Seville", "塞维利亚"), ("Valencia", "瓦伦西亚"), ("Antwerp", "安特卫普"), ("Rotterdam", "鹿特丹"),
    ("Bordeaux", "波尔多"), ("Salzburg", "萨尔茨堡"), ("Gdansk", "格但斯克"), ("Bergen", "卑尔根"),
    ("Gothenburg", "哥德堡"), ("Belfast", "贝尔法斯特"), ("Cardiff", "加的夫"), ("Oxford", "牛津"),
    ("Cambridge", "剑桥"), ("Phoenix", "菲尼克斯"), ("Austin", "奥斯汀"), ("Portland", "波特兰"),
    ("Nashville", "纳什维尔"), ("Honolulu", "火奴鲁鲁"), ("Anchorage", "安克雷奇"), ("Panama City", "巴拿马城"),
    ("Montevideo", "蒙得维的亚"), ("La Paz", "拉巴斯"), ("Medellin", "麦德林"), ("Monterrey", "蒙特雷"),
]

# Syllables for made-up English names; characters Chinese transliterations and place names use.
_ONSETS = ["B", "Br", "C", "Ch", "D", "Dr", "F", "G", "Gr", "H", "J", "K", "Kr", "L", "M", "N", "P", "Pr", "Q", "R",
           "S", "Sh", "St", "T", "Tr", "V", "W", "Y", "Z", ""]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "au", "ea", "ie", "oa", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "m", "k", "t", "nd", "rt", "sk", "ng", "x", "v"]
_ENDINGS = ["", "", "", "ville", "burg", "ton", "ford", "port", "stad", "grad", "polis", "mouth", "holm", "dale",
            "vik", "ia", "ona", "ara", "ek", "ov", "ach", "ez", "field", "haven", "sund"]
_PREFIXES = ["New ", "San ", "Port ", "Saint ", "Fort ", "Lake ", "El ", "Los "]
HAN_NAME_CHARS = ("阿埃艾爱安奥澳巴班邦堡北贝本比彼波伯博布才达大丹道德登迪蒂丁东都杜顿多厄恩尔法凡菲费芬丰"
                  "佛弗福冈港高哥格根古瓜广哈海汉杭河赫黑亨红湖华怀基吉加佳杰金津京景喀卡开凯坎康科克肯库"
                  "拉莱兰朗劳乐勒雷里利莉连林临隆卢鲁伦罗洛马迈麦曼梅门蒙孟米明莫墨穆纳南内尼宁纽诺帕潘佩"
                  "皮平普齐奇乔切青清琼泉萨塞桑森沙山上圣施石斯松苏索塔泰坦汤特提天通图托瓦万威维温文沃乌"
                  "武西希夏厦仙香肖谢新休雅亚延扬阳耶伊英尤约云泽扎珠州庄日满岛昆春长安城江宁庆那")

# last characters of transliterated names, several of them also common in ordinary text (那边, 都是, 里面, 多少):
# the extended rules end a third of the made-up Han names with one, and often write 现在/今天/的天气 straight
# after the name, so the call learns where a name stops
HAN_FINALS = "那都斯亚尔拉克多里城山港堡德特纳瓦丁森诺"

# how people write multi-word and hyphenated place names; "{w}" and "{v}" are made-up words
_COMPOUNDS = ["{w} {v}", "{w}-{v}", "Saint-{w}", "{w}-sur-Mer", "{w}-on-Sea", "Port-au-{w}", "{w} City",
              "{w} Springs", "Upper {w}", "Santa {w}", "{w} de {v}", "Bad {w}", "{w}-le-{v}", "{w} Bay"]


def made_up_city(rng: random.Random, lang: str, extended: bool = False) -> str:
    """A city name that is in no list: syllables (English) or 2-4 place-name characters (Chinese); `extended`:
    Chinese names of 2-5 characters, longer ones as often as short, a third ending in one of HAN_FINALS, and a
    quarter of English names multi-word or hyphenated (`_COMPOUNDS`)."""
    if lang == "zh":
        sizes = (2, 3, 3, 4, 4, 5) if extended else (2, 2, 3, 3, 4)
        name = "".join(rng.choice(HAN_NAME_CHARS) for _ in range(rng.choice(sizes)))
        if extended and rng.random() < 0.35:   # a last character that ordinary text also uses after a name
            name = name[:-1] + rng.choice(HAN_FINALS)
        return name
    if extended and rng.random() < 0.25:
        return rng.choice(_COMPOUNDS).format(w=_word(rng), v=_word(rng))
    word = _word(rng)
    return (rng.choice(_PREFIXES) if rng.random() < 0.1 else "") + word


def _word(rng: random.Random) -> str:
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.choice((1, 2, 2, 3))))
    word = (word + rng.choice(_ENDINGS)).capitalize()
    if len(word) < 4:
        word += rng.choice(["ton", "ia", "burg", "ora"])
    return word
